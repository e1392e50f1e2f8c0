//! `DdprofRecorder::Labels::Slot`: one thread's application labels (lib/ddprof_recorder/labels.rb),
//! kept natively so that setting and restoring them costs the application little and the
//! sampler reads them without Ruby state of their own.
//!
//! A slot holds the label set on now (a frozen Array of frozen `[key, value]` Arrays, the form
//! the sampler builds its label sets from), the sets below it (nesting: `push` returns the
//! depth that `pop` restores), and a ring of its last [`HISTORY`] changes with their
//! `CLOCK_MONOTONIC` times: a sample read at a CPU tick may be recorded a few ticks later (the
//! signal handler keeps samples in batches), and `at(tick_ns)` gives the set that was on at
//! the tick. A request makes two changes (its span on and off), so the ring holds the last 32
//! requests of a thread: a 40 ms batch at 99 Hz held 11 requests of 3.5 ms on the Rails app.
//!
//! `push_hash` validates and merges a Hash of labels here (what Ruby did in `Labels.merge`,
//! most of the cost of `with_labels`); on bad input it returns nil and changes nothing, and
//! the Ruby caller raises the `ArgumentError` that says what is wrong (so the messages are
//! written once, in Ruby). Limits (`MAX_BYTES`, `MAX_LABELS`, `RESERVED`) come from Ruby at
//! load ([`configure`]): they are stated once, there.
//!
//! # Ruby objects here
//!
//! The slot keeps `VALUE`s (magnus's `Value` is not `Send`, and a `TypedData` must be): the
//! sets, the stack and Endpoints' open request. Its mark function marks each with `rb_gc_mark`,
//! which pins it, so a compaction never moves one and no compaction callback is needed. Every
//! access holds the GVL: the methods are Ruby methods, and the sampler calls `at` from Ruby. The
//! state is a `RefCell`; nothing that allocates (which may start a GC, which calls `mark`)
//! runs while it is borrowed mutably, and `mark` only borrows it shared.
use std::cell::RefCell;
use std::sync::OnceLock;

use magnus::{
    function, gc, method, prelude::*, r_hash::ForEach, rb_sys::AsRawValue, rb_sys::FromRawValue,
    value::ReprValue, DataTypeFunctions, Error, RArray, RHash, RModule, RString, Ruby, TypedData,
    Value,
};
use rb_sys::VALUE;

use crate::recorder::errors::{arg_error, entry};

/// Changes a slot remembers with their times (see the module doc).
pub const HISTORY: usize = 64;

/// What a label may be, from lib/ddprof_recorder/labels.rb.
struct Limits {
    max_bytes: usize,
    max_labels: usize,
    reserved: Vec<Vec<u8>>,
}

static LIMITS: OnceLock<Limits> = OnceLock::new();

struct State {
    /// The slot's number in the process, the high half of its span ids.
    serial: u64,
    spans: u64,
    /// The set on now.
    pairs: VALUE,
    /// The sets below it, oldest first.
    stack: Vec<VALUE>,
    /// The ring of changes: at `times[i]` the set became `sets[i]`; `filled` are in use, the
    /// newest at `last`.
    times: [u64; HISTORY],
    sets: [VALUE; HISTORY],
    filled: usize,
    last: usize,
    /// Endpoints' request whose body the server is writing on this thread, or nil.
    open_body: VALUE,
}

#[derive(TypedData)]
#[magnus(class = "DdprofRecorder::Labels::Slot", mark, free_immediately, size)]
pub struct Slot(RefCell<State>);

impl DataTypeFunctions for Slot {
    fn mark(&self, marker: &gc::Marker) {
        // A failed borrow would be a method that allocated while it held the state mutably,
        // which none does (module doc): marking nothing then would free live sets, so end.
        let Ok(state) = self.0.try_borrow() else {
            magnus::error::bug("ddprof_recorder: a label slot was marked while being changed")
        };
        let mark = |v: VALUE| {
            // SAFETY: every VALUE the state holds is a live object it keeps (this marks it).
            marker.mark(unsafe { Value::from_raw(v) })
        };
        mark(state.pairs);
        state.stack.iter().copied().for_each(mark);
        state.sets[..state.filled].iter().copied().for_each(mark);
        mark(state.open_body);
    }

    fn size(&self) -> usize {
        std::mem::size_of::<Self>()
            + self.0.try_borrow().map_or(0, |s| s.stack.capacity() * std::mem::size_of::<VALUE>())
    }
}

/// `CLOCK_MONOTONIC` in ns: Ruby's `Process.clock_gettime(Process::CLOCK_MONOTONIC,
/// :nanosecond)`, and the clock the signal handler stamps its samples with.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec to write; CLOCK_MONOTONIC exists on every Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64)
}

impl State {
    fn change(&mut self, pairs: VALUE) {
        self.last = (self.last + 1) % HISTORY;
        self.times[self.last] = monotonic_ns();
        self.sets[self.last] = pairs;
        self.filled = (self.filled + 1).min(HISTORY);
        self.pairs = pairs;
    }

    /// The set on at `at_ns`: the newest change at or before it, else the oldest kept.
    fn at(&self, at_ns: u64) -> VALUE {
        let mut i = self.last;
        for _ in 1..self.filled {
            if at_ns >= self.times[i] {
                return self.sets[i];
            }
            i = if i == 0 { HISTORY - 1 } else { i - 1 };
        }
        self.sets[i]
    }
}

/// A label pair's key (a frozen `[key, value]` Array's first element).
fn pair_key(pair: Value) -> Option<RString> {
    RArray::from_value(pair).and_then(|a| a.entry::<Value>(0).ok()).and_then(RString::from_value)
}

/// The bytes of `s`, copied (a key compared after later allocations must not borrow them).
fn bytes(s: RString) -> Vec<u8> {
    // SAFETY: the slice is copied at once, before anything can change or move the string.
    unsafe { s.as_slice() }.to_vec()
}

/// A label string as the set keeps it: itself if frozen, else its interned copy.
fn kept(s: RString) -> RString {
    if s.is_frozen() {
        s
    } else {
        s.to_interned_str()
    }
}

impl Slot {
    fn new(ruby: &Ruby, serial: u64, none: RArray) -> Result<Self, Error> {
        entry(ruby, || {
            let none = none.as_raw();
            Ok(Slot(RefCell::new(State {
                serial,
                spans: 0,
                pairs: none,
                stack: Vec::new(),
                times: [0; HISTORY],
                sets: [none; HISTORY],
                filled: 1,
                last: 0,
                open_body: ruby.qnil().as_raw(),
            })))
        })
    }

    fn pairs(&self) -> Value {
        // SAFETY: a live set the slot marks.
        unsafe { Value::from_raw(self.0.borrow().pairs) }
    }

    fn depth(&self) -> usize {
        self.0.borrow().stack.len()
    }

    fn at(&self, at_ns: i64) -> Value {
        // SAFETY: a live set the slot marks.
        unsafe { Value::from_raw(self.0.borrow().at(at_ns.max(0) as u64)) }
    }

    fn open_body(&self) -> Value {
        // SAFETY: a live object the slot marks (nil when none).
        unsafe { Value::from_raw(self.0.borrow().open_body) }
    }

    fn set_open_body(&self, open: Value) {
        self.0.borrow_mut().open_body = open.as_raw();
    }

    fn next_span_id(&self) -> u64 {
        let mut state = self.0.borrow_mut();
        state.spans += 1;
        (state.serial << 32) | (state.spans & 0xffff_ffff)
    }

    /// The current set without the keys `fresh_keys`, then the `fresh` pairs that `add` puts
    /// in, frozen; None past `limit`. Allocates: the state is not borrowed across it.
    fn merged(
        &self,
        ruby: &Ruby,
        fresh_keys: &[Vec<u8>],
        limit: usize,
        add: impl FnOnce(RArray) -> Result<(), Error>,
    ) -> Result<Option<Value>, Error> {
        let base = RArray::from_value(self.pairs()).unwrap_or_else(|| ruby.ary_new());
        let all = ruby.ary_new_capa(base.len() + fresh_keys.len());
        for pair in base.into_iter() {
            let replaced = pair_key(pair).is_some_and(|k| {
                // SAFETY: compared at once, with nothing run between.
                let key = unsafe { k.as_slice() };
                fresh_keys.iter().any(|fresh| fresh.as_slice() == key)
            });
            if !replaced {
                all.push(pair)?;
            }
        }
        add(all)?;
        if all.len() > limit {
            return Ok(None);
        }
        all.freeze();
        Ok(Some(all.as_value()))
    }

    /// Pushes `set` over the current one; the depth before, for `pop`.
    fn push_set(&self, set: Value) -> usize {
        let mut state = self.0.borrow_mut();
        let depth = state.stack.len();
        let pairs = state.pairs;
        state.stack.push(pairs);
        state.change(set.as_raw());
        depth
    }

    /// `push(set)`: a set made in Ruby (frozen, of frozen pairs).
    fn push(ruby: &Ruby, rb_self: &Self, set: RArray) -> Result<usize, Error> {
        entry(ruby, || Ok(rb_self.push_set(set.as_value())))
    }

    /// `push_pair(pair, limit)`: the current set with `pair` (a frozen `[key, value]`) on top,
    /// its key replacing the current one's; nil, and nothing changed, past `limit` labels.
    fn push_pair(
        ruby: &Ruby,
        rb_self: &Self,
        pair: RArray,
        limit: usize,
    ) -> Result<Option<usize>, Error> {
        entry(ruby, || {
            let key: Vec<Vec<u8>> = pair_key(pair.as_value()).map(bytes).into_iter().collect();
            let Some(set) = rb_self.merged(ruby, &key, limit, |all| all.push(pair))? else {
                return Ok(None);
            };
            Ok(Some(rb_self.push_set(set)))
        })
    }

    /// `push_hash(labels)`: the current set with the pairs of Hash `labels` on top; nil, and
    /// nothing changed, when `labels` is not a Hash of valid String keys and values, or would
    /// make more than MAX_LABELS (Ruby then raises the error that says why).
    fn push_hash(ruby: &Ruby, rb_self: &Self, labels: Value) -> Result<Option<usize>, Error> {
        entry(ruby, || {
            let Some(limits) = LIMITS.get() else { return Ok(None) };
            let Some(hash) = RHash::from_value(labels) else { return Ok(None) };
            let mut valid = true;
            let mut strings: Vec<(RString, RString)> = Vec::with_capacity(hash.len());
            hash.foreach(|key: Value, value: Value| {
                let (Some(k), Some(v)) = (RString::from_value(key), RString::from_value(value))
                else {
                    valid = false;
                    return Ok(ForEach::Stop);
                };
                // SAFETY: read at once; nothing runs between.
                let key_bytes = unsafe { k.as_slice() };
                if key_bytes.is_empty()
                    || key_bytes.len() > limits.max_bytes
                    || v.len() > limits.max_bytes
                    || limits.reserved.iter().any(|r| r.as_slice() == key_bytes)
                {
                    valid = false;
                    return Ok(ForEach::Stop);
                }
                strings.push((k, v));
                Ok(ForEach::Continue)
            })?;
            if !valid {
                return Ok(None);
            }
            let keys: Vec<Vec<u8>> = strings.iter().map(|&(k, _)| bytes(k)).collect();
            let set = rb_self.merged(ruby, &keys, limits.max_labels, |all| {
                for (k, v) in strings {
                    let pair = ruby.ary_from_iter([kept(k).as_value(), kept(v).as_value()]);
                    pair.freeze();
                    all.push(pair)?;
                }
                Ok(())
            })?;
            let Some(set) = set else { return Ok(None) };
            Ok(Some(rb_self.push_set(set)))
        })
    }

    /// `pop(depth)`: back to the set that was on at `depth` (what `push` returned).
    fn pop(ruby: &Ruby, rb_self: &Self, depth: Value) -> Result<(), Error> {
        entry(ruby, || {
            let size = rb_self.depth();
            let at = magnus::Integer::from_value(depth).and_then(|i| i.to_i64().ok());
            let Some(at) = at.filter(|&d| d >= 0 && (d as usize) < size) else {
                return Err(arg_error(
                    ruby,
                    format!(
                        "pop_labels: {} is not a depth push_labels returned on this thread ({size} set(s) on)",
                        depth.inspect()
                    ),
                ));
            };
            let mut state = rb_self.0.borrow_mut();
            let pairs = state.stack[at as usize];
            state.stack.truncate(at as usize);
            state.change(pairs);
            Ok(())
        })
    }
}

/// `Slot.configure(max_bytes, max_labels, reserved_keys)`, once at load.
fn configure(
    ruby: &Ruby,
    max_bytes: usize,
    max_labels: usize,
    reserved: RArray,
) -> Result<(), Error> {
    entry(ruby, || {
        let mut keys = Vec::with_capacity(reserved.len());
        for key in reserved.into_iter() {
            let key = RString::from_value(key)
                .ok_or_else(|| arg_error(ruby, "reserved keys must be Strings"))?;
            keys.push(bytes(key));
        }
        // A second call (the file loaded twice) keeps the first: the same constants.
        let _ = LIMITS.set(Limits { max_bytes, max_labels, reserved: keys });
        Ok(())
    })
}

pub fn init(ruby: &Ruby, module: RModule) -> Result<(), Error> {
    let labels = module.define_module("Labels")?;
    let class = labels.define_class("Slot", ruby.class_object())?;
    class.const_set("HISTORY", HISTORY)?;
    class.define_singleton_method("configure", function!(configure, 3))?;
    class.define_singleton_method("new", function!(Slot::new, 2))?;
    class.define_method("pairs", method!(Slot::pairs, 0))?;
    class.define_method("depth", method!(Slot::depth, 0))?;
    class.define_method("at", method!(Slot::at, 1))?;
    class.define_method("open_body", method!(Slot::open_body, 0))?;
    class.define_method("open_body=", method!(Slot::set_open_body, 1))?;
    class.define_method("next_span_id", method!(Slot::next_span_id, 0))?;
    class.define_method("push", method!(Slot::push, 1))?;
    class.define_method("push_pair", method!(Slot::push_pair, 2))?;
    class.define_method("push_hash", method!(Slot::push_hash, 1))?;
    class.define_method("pop", method!(Slot::pop, 1))?;
    Ok(())
}
