//! The two-slot recorder: one thread records samples while another serializes, and the
//! sampler never waits for the serializer.
//!
//! # Threads
//!
//! - The **sampler** calls [`Recorder::record_sample`] and [`Recorder::record_endpoint`]. One
//!   sampler at a time (in Ruby the GVL guarantees it: a sampler holds the GVL for the whole
//!   call and never releases it while it holds a slot).
//! - The **serializer** calls [`Recorder::start_next_profile`], then [`PendingFlip::flip`] on
//!   what it returns (or [`Recorder::serialize`], which does both). One serializer at a time:
//!   the `serializer` lock is held from the first call to the end of the second, and is only
//!   ever `try_lock`ed, so a second serializer gets [`SerializeError::Busy`] instead of waiting
//!   (the Ruby side also guards serializations with a `Mutex`).
//!
//! # The protocol
//!
//! There are two profiles, each in its own [`parking_lot::Mutex`]: the *slots*. The **active**
//! slot is the one whose lock is free; the **inactive** slot's lock is held by the serializer
//! side between serializations, as an owned [`ArcMutexGuard`] kept in [`SerializerSide`].
//! A new recorder has slot one active and slot two held.
//!
//! The sampler never blocks and never reads `active_slot`: it `try_lock`s slot one, then slot
//! two, and does that twice at most. Exactly one slot is free in the steady state, so the first
//! round succeeds unless a flip happened between its two probes; the second round then finds
//! the slot the flip freed. If both rounds fail (never expected), the sample is counted in
//! `samples_lost` and [`RecordError::SlotsBusy`] is returned: nothing is half-recorded.
//!
//! The serializer flips in three steps, then works on the now-inactive profile alone:
//! 1. drop the guard of the previously inactive slot: samplers can now use it;
//! 2. `lock` the previously active slot: this waits only for a sampler already inside it,
//!    which holds it for one `record_sample` call;
//! 3. store the new `active_slot` (for tests and for the serializer's own bookkeeping).
//!
//! Between 1 and 2 both slots are free and a sampler may use either: a sample in the
//! previously inactive slot goes into the next profile, one in the previously active slot into
//! this one. Either is correct, and no sample is ever in both or in neither.
//!
//! Before the flip, [`Recorder::start_next_profile`] resets the inactive profile with
//! `start = finish` so that each window starts exactly where the previous one ended. The
//! binding calls it while holding the GVL (as dd-trace-rb does): it never blocks, since the serializer
//! lock is only `try_lock`ed. It runs [`PendingFlip::flip`] without the GVL, so Ruby keeps
//! running while the profile is encoded; the only blocking lock of the protocol, step 2, waits
//! there for a sampler that holds the GVL.
//!
//! Nobody but the flip's step 2 ever parks on a slot or the serializer lock: samplers and the
//! serializer lock use `try_lock`, and there is one serializer at a time, so a slot has at most
//! one parked waiter, and only while the serializer lock is held.
//!
//! # Comments
//!
//! The comments every serialized profile carries ([`Recorder::set_comments`]) are configuration
//! that can change: an `Arc<[String]>` behind a lock of their own, replaced whole. A
//! serialization clones the `Arc` in [`Recorder::start_next_profile`] and encodes with its
//! clone, so the lock is only ever held to clone or replace a pointer, the sampler never takes
//! it, and setting comments never waits for an encode (nor an encode for it).
//!
//! # Reset and fork
//!
//! A recorder is never reset in place: [`Recorder::renewed`] and [`Recorder::after_fork`] make
//! a new one, in the initial state, with the same config, which replaces it. A by-hand reset
//! ([`Recorder::renewed`]) shares the counters with the old recorder, which a serialization in
//! progress finishes with undisturbed (its window is the old recorder's).
//!
//! A fork copies the recorder in whatever state the parent's threads left it: a lock may be
//! held by a thread that does not exist in the child, with a serializer parked on a slot, and
//! unlocking a parking_lot lock with a parked waiter can hang the child (docs/design.md,
//! section 6, tells why; `tests/fork.rs` hung in its first round with the old in-place reset).
//!
//! So [`Recorder::after_fork`] never unlocks, and never waits for, a lock of the inherited
//! recorder (it only reads whether they are held, one atomic load each, and `try_lock`s the
//! comments lock, one compare-and-swap that it never undoes; neither touches the parking
//! table): the child gets fresh locks and fresh profiles, with the counters and comments copied
//! (the comments only if their lock was free).
//! The inherited recorder is dropped only if no thread was inside it at the fork (no lock held
//! but the inactive slot's, no other reference); otherwise it is kept, never touched again,
//! since dropping it would unlock locks with parked waiters and free profiles a parent thread
//! may have been changing. (dd-trace-rb likewise re-initializes its pthread mutexes in the
//! child.)
//!
//! # Memory
//!
//! Each profile is bounded by the [`Limits`] of the [`Config`]: a sample over them folds into
//! one placeholder sample, counted in `samples_dropped`. [`Recorder::heap_bytes`] answers how
//! much memory both profiles hold without taking either lock (it runs on Ruby's GC thread,
//! for `ObjectSpace.memsize_of`): each slot caches its profile's size in an atomic, written by
//! whoever holds the slot when the size can have changed (a new distinct sample or endpoint,
//! a reset).
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{ArcMutexGuard, Mutex, MutexGuard, RawMutex};

use crate::error::{ConfigError, RecordError, SerializeError};
use crate::pprof::{self, Compression};
use crate::profile::{validate, Limits, Profile};
use crate::sample::{Sample, SpanId, ValueType};
use crate::time::Timestamp;
use crate::{MAX_COMMENTS, MAX_COMMENT_BYTES, MAX_FRAMES_RANGE, MAX_VALUE_TYPES};

/// What a recorder records: its value types (in value order), the stack depth limit and the
/// per-profile [`Limits`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    value_types: Vec<ValueType>,
    max_frames: usize,
    limits: Limits,
}

impl Config {
    pub fn new(value_types: Vec<ValueType>, max_frames: usize) -> Result<Self, ConfigError> {
        if !(1..=MAX_VALUE_TYPES).contains(&value_types.len()) {
            return Err(ConfigError::ValueTypesCount(value_types.len()));
        }
        for (index, vt) in value_types.iter().enumerate() {
            if vt.r#type.is_empty() || vt.unit.is_empty() {
                return Err(ConfigError::EmptyValueType { index });
            }
            if value_types[..index].iter().any(|other| other.r#type == vt.r#type) {
                return Err(ConfigError::DuplicateValueType(vt.r#type.clone()));
            }
        }
        if !MAX_FRAMES_RANGE.contains(&max_frames) {
            return Err(ConfigError::MaxFrames(max_frames));
        }
        Ok(Self { value_types, max_frames, limits: Limits::DEFAULT })
    }

    /// The same config with other per-profile limits (each in `1..=Limits::MAX`).
    pub fn with_limits(self, limits: Limits) -> Result<Self, ConfigError> {
        limits.validate()?;
        Ok(Self { limits, ..self })
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// An empty profile for this config, starting at `start`.
    fn new_profile(&self, start: Timestamp) -> Profile {
        Profile::with_limits(self.value_types.len(), start, self.limits)
    }

    pub fn value_types(&self) -> &[ValueType] {
        &self.value_types
    }

    pub fn max_frames(&self) -> usize {
        self.max_frames
    }
}

/// One serialized time window.
#[derive(Debug)]
pub struct Serialized {
    pub start: Timestamp,
    pub finish: Timestamp,
    /// The pprof (gzip-compressed if asked); empty for [`Recorder::clear`].
    pub bytes: Vec<u8>,
}

/// What a flip does with the profile it takes out of service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Pprof(Compression),
    Discard,
}

/// Counters over the recorder's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatsSnapshot {
    pub samples_recorded: u64,
    pub samples_rejected: u64,
    pub samples_dropped: u64,
    /// `record_endpoint` calls ignored because the profile was at its limits.
    pub endpoints_dropped: u64,
    /// Timed samples aggregated without their time: the profile held
    /// [`Limits::max_timed_samples`] already.
    pub timestamps_dropped: u64,
    pub samples_lost: u64,
    pub serializations: u64,
    pub last_serialization_ns: u64,
    pub last_serialization_bytes: u64,
}

#[derive(Debug, Default)]
struct Stats {
    samples_recorded: AtomicU64,
    samples_rejected: AtomicU64,
    samples_dropped: AtomicU64,
    endpoints_dropped: AtomicU64,
    timestamps_dropped: AtomicU64,
    samples_lost: AtomicU64,
    serializations: AtomicU64,
    last_serialization_ns: AtomicU64,
    last_serialization_bytes: AtomicU64,
}

impl Stats {
    /// A copy of `self`'s counts (for a forked child: they are plain memory there).
    fn copy(&self) -> Self {
        let copy = |counter: &AtomicU64| AtomicU64::new(counter.load(Relaxed));
        Self {
            samples_recorded: copy(&self.samples_recorded),
            samples_rejected: copy(&self.samples_rejected),
            samples_dropped: copy(&self.samples_dropped),
            endpoints_dropped: copy(&self.endpoints_dropped),
            timestamps_dropped: copy(&self.timestamps_dropped),
            samples_lost: copy(&self.samples_lost),
            serializations: copy(&self.serializations),
            last_serialization_ns: copy(&self.last_serialization_ns),
            last_serialization_bytes: copy(&self.last_serialization_bytes),
        }
    }
}

type Slot = Arc<Mutex<Profile>>;
type SlotGuard = ArcMutexGuard<RawMutex, Profile>;

/// State only the serializer touches, behind the `serializer` lock.
struct SerializerSide {
    /// The held lock of the inactive slot. `None` only between the flip's steps 1 and 2.
    inactive: Option<SlotGuard>,
}

pub struct Recorder {
    config: Config,
    /// What every profile serialized from now on says in its `comment` field, replaced whole
    /// by [`Recorder::set_comments`]. The lock is held only to clone or replace the `Arc`:
    /// never by a sampler, never while encoding (a serialization takes its clone in
    /// [`Recorder::start_next_profile`]).
    comments: Mutex<Arc<[String]>>,
    /// Heap bytes of `comments`, for [`Recorder::heap_bytes`] (which takes no lock).
    comments_heap: AtomicUsize,
    slots: [Slot; 2],
    /// `heap_bytes` of each slot's profile, written by the holder of that slot's lock.
    slot_heap: [AtomicUsize; 2],
    /// Held for a whole serialization; only ever `try_lock`ed.
    serializer: Mutex<SerializerSide>,
    /// 1 or 2. Written by the serializer side only; the sampler never reads it.
    active_slot: AtomicU8,
    /// Shared with the recorders that [`Recorder::renewed`] makes.
    stats: Arc<Stats>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("config", &self.config)
            .field("active_slot", &self.active_slot())
            .finish_non_exhaustive()
    }
}

/// A serialization under way, from [`Recorder::start_next_profile`] to [`PendingFlip::flip`]:
/// it holds the serializer lock. `Send` (parking_lot's `send_guard`), so that the binding can
/// take it with the GVL and flip without it. Dropped without a flip, it only releases the lock.
pub struct PendingFlip<'a> {
    recorder: &'a Recorder,
    side: MutexGuard<'a, SerializerSide>,
    finish: Timestamp,
    /// The recorder's comments when the serialization started.
    comments: Arc<[String]>,
}

impl std::fmt::Debug for PendingFlip<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingFlip").field("finish", &self.finish).finish_non_exhaustive()
    }
}

impl Recorder {
    /// A recorder whose first profile starts at `start`, with slot one active.
    pub fn new(config: Config, start: Timestamp) -> Self {
        Self::with_stats(config, start, Arc::default(), Arc::new([]))
    }

    fn with_stats(
        config: Config,
        start: Timestamp,
        stats: Arc<Stats>,
        comments: Arc<[String]>,
    ) -> Self {
        let profiles = [config.new_profile(start), config.new_profile(start)];
        let slot_heap = profiles.each_ref().map(|p| AtomicUsize::new(p.heap_bytes()));
        let slots = profiles.map(|p| Arc::new(Mutex::new(p)));
        let inactive = slots[1].lock_arc();
        Self {
            config,
            comments_heap: AtomicUsize::new(comments_heap_bytes(&comments)),
            comments: Mutex::new(comments),
            serializer: Mutex::new(SerializerSide { inactive: Some(inactive) }),
            slot_heap,
            slots,
            active_slot: AtomicU8::new(1),
            stats,
        }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Sets the comments (pprof's `comment` field: one line each, e.g. how the profile was
    /// sampled) of every profile whose serialization starts after this call; a serialization
    /// already under way keeps the comments it started with. At most [`MAX_COMMENTS`], each
    /// non-empty and at most [`MAX_COMMENT_BYTES`] long; on error nothing changes. None (the
    /// default): profiles have no `comment` field. Kept by [`Recorder::renewed`] and
    /// [`Recorder::after_fork`], like the config.
    ///
    /// Never touches a slot, so a sampler never waits for it. The lock it takes is held by
    /// others only to clone an `Arc`, and in the binding only with the GVL held, as here: it is
    /// never contended there.
    pub fn set_comments(&self, comments: Vec<String>) -> Result<(), ConfigError> {
        if comments.len() > MAX_COMMENTS {
            return Err(ConfigError::CommentsCount(comments.len()));
        }
        for (index, comment) in comments.iter().enumerate() {
            if comment.is_empty() {
                return Err(ConfigError::EmptyComment { index });
            }
            if comment.len() > MAX_COMMENT_BYTES {
                return Err(ConfigError::CommentTooLong { index, bytes: comment.len() });
            }
        }
        let comments: Arc<[String]> = comments.into();
        let mut held = self.comments.lock();
        self.comments_heap.store(comments_heap_bytes(&comments), Relaxed);
        let old = std::mem::replace(&mut *held, comments);
        drop(held);
        drop(old); // freed after the lock is released
        Ok(())
    }

    /// The comments every profile serialized from now on carries ([`Recorder::set_comments`]).
    pub fn comments(&self) -> Arc<[String]> {
        Arc::clone(&self.comments.lock())
    }

    /// Records a sample in the active profile. Never blocks. On error nothing is recorded.
    pub fn record_sample(&self, sample: &Sample<'_>) -> Result<(), RecordError> {
        if let Err(e) = validate(sample, self.config.value_types.len()) {
            self.note_rejected();
            return Err(e);
        }
        let max_frames = self.config.max_frames;
        let (stored, untimed) = self.with_active_profile(|profile, heap| {
            let distinct = (profile.sample_count(), profile.timed_sample_count());
            let untimed = profile.timestamps_dropped();
            let stored = profile.add_validated(sample, max_frames);
            // Only a new distinct or timed sample can have grown the profile (a new string,
            // location, stack or label set always makes one): the common case skips the recount.
            if (profile.sample_count(), profile.timed_sample_count()) != distinct {
                heap.store(profile.heap_bytes(), Relaxed);
            }
            (stored, profile.timestamps_dropped() != untimed)
        })?;
        self.stats.samples_recorded.fetch_add(1, Relaxed);
        if !stored {
            self.stats.samples_dropped.fetch_add(1, Relaxed);
        }
        if untimed {
            self.stats.timestamps_dropped.fetch_add(1, Relaxed);
        }
        Ok(())
    }

    /// Links samples of the active profile with `"local root span id" == span` (recorded
    /// before or after this call) to `endpoint`. Never blocks. An endpoint over the profile
    /// limits is ignored and counted in `endpoints_dropped`.
    pub fn record_endpoint(&self, span: SpanId<'_>, endpoint: &str) -> Result<(), RecordError> {
        let stored = self.with_active_profile(|profile, heap| {
            let stored = profile.record_endpoint(span, endpoint);
            heap.store(profile.heap_bytes(), Relaxed);
            stored
        })?;
        if !stored {
            self.stats.endpoints_dropped.fetch_add(1, Relaxed);
        }
        Ok(())
    }

    /// Counts a `record_sample` call that the caller refused before reaching the recorder
    /// (bad arguments found while converting them).
    pub fn note_rejected(&self) {
        self.stats.samples_rejected.fetch_add(1, Relaxed);
    }

    /// For tests: runs `f` while holding the active slot, as a sampler inside `record_sample`
    /// does (found the sampler's way; [`RecordError::SlotsBusy`] if both slots are taken). A
    /// serialization meanwhile waits in its flip's step 2.
    pub fn hold_active_slot<R>(&self, f: impl FnOnce() -> R) -> Result<R, RecordError> {
        self.with_active_profile(|_, _| f())
    }

    /// The sampler's side of the protocol: `try_lock` slot one, then slot two, twice at most.
    fn with_active_profile<R>(
        &self,
        f: impl FnOnce(&mut Profile, &AtomicUsize) -> R,
    ) -> Result<R, RecordError> {
        for _attempt in 0..2 {
            for (slot, heap) in self.slots.iter().zip(&self.slot_heap) {
                if let Some(mut profile) = slot.try_lock() {
                    return Ok(f(&mut profile, heap));
                }
            }
        }
        self.stats.samples_lost.fetch_add(1, Relaxed);
        Err(RecordError::SlotsBusy)
    }

    /// Serializer step 0: takes the serializer lock without waiting ([`SerializeError::Busy`]
    /// if another serialization holds it) and resets the inactive profile so that it starts at
    /// `finish`, the end of the window about to be serialized. The binding calls it with the
    /// GVL held: it never blocks. The lock is held until the returned flip is done or dropped.
    pub fn start_next_profile(&self, finish: Timestamp) -> Result<PendingFlip<'_>, SerializeError> {
        let mut side = self.serializer.try_lock().ok_or(SerializeError::Busy)?;
        let inactive = side.inactive.as_mut().ok_or(SerializeError::Inconsistent)?;
        inactive.reset(finish);
        Ok(PendingFlip { recorder: self, side, finish, comments: self.comments() })
    }

    /// Ends the current window at `now` and returns it as pprof: [`Recorder::start_next_profile`]
    /// then [`PendingFlip::flip`], for callers that have no GVL to juggle.
    pub fn serialize(&self, compression: Compression) -> Result<Serialized, SerializeError> {
        self.start_next_profile(Timestamp::now())?.flip(Output::Pprof(compression))
    }

    /// A new recorder in the initial state (slot one active and empty, slot two held and
    /// empty, both starting at `now`, no endpoints) with this one's config, sharing its
    /// counters and comments: the by-hand reset, in the same process. Touches no slot or
    /// serializer lock of `self` (only the comments lock, to clone an `Arc`), so it never waits
    /// for a serialization in progress, which finishes with `self`.
    pub fn renewed(&self, now: Timestamp) -> Recorder {
        Self::with_stats(self.config.clone(), now, Arc::clone(&self.stats), self.comments())
    }

    /// For a forked child: replaces `recorder` (the recorder as the fork copied it) with a new
    /// one in the initial state, starting at `now`, with its config and a copy of its counters.
    /// Never unlocks or waits for a lock of the inherited recorder (see the module docs), which
    /// is dropped if no thread of the parent was inside it at the fork, and kept otherwise.
    ///
    /// Call it before anything else in the child uses the recorder: the threads of the parent
    /// do not exist there, and no other thread of the child may be using it.
    pub fn after_fork(recorder: &mut Arc<Recorder>, now: Timestamp) {
        let stats = Arc::new(recorder.stats.copy());
        let comments = recorder.comments_after_fork();
        let comments_were_free = comments.is_some();
        let fresh = Arc::new(Self::with_stats(
            recorder.config.clone(),
            now,
            stats,
            comments.unwrap_or_else(|| Arc::new([])),
        ));
        let inherited = std::mem::replace(recorder, fresh);
        // Whether any lock is held but the one the serializer side keeps on the inactive slot:
        // a plain load of each lock's state. Nobody parks on a slot without holding the
        // serializer lock (module docs), so when it is free no lock has a parked waiter, and
        // dropping unlocks only the inactive slot, on parking_lot's fast path.
        let inactive = usize::from(inherited.active_slot() == 1);
        let quiet = !inherited.serializer.is_locked()
            && comments_were_free
            && !inherited.slots[1 - inactive].is_locked()
            && inherited.slots[inactive].is_locked();
        match Arc::try_unwrap(inherited) {
            Ok(alone) if quiet => drop(alone),
            Ok(busy) => keep_after_fork(Arc::new(busy)),
            // Another reference: a thread of the parent was using it.
            Err(shared) => keep_after_fork(shared),
        }
    }

    /// A forked child's copy of the comments. Their lock is `try_lock`ed (one compare-and-swap,
    /// which never waits) and then leaked, held for good: releasing it could touch
    /// parking_lot's parking table (see the module docs), and nobody takes it again, since the
    /// inherited recorder is dropped or kept untouched right after. `None` if a thread of the
    /// parent held the lock at the fork: the child then starts with none. (Never in Ruby:
    /// whoever takes it holds the GVL, which the forking thread held.)
    ///
    /// Only for [`Recorder::after_fork`], on the inherited recorder.
    fn comments_after_fork(&self) -> Option<Arc<[String]>> {
        self.comments.try_lock().map(|held| Arc::clone(MutexGuard::leak(held)))
    }

    /// Heap bytes both profiles hold (plus the recorder's own allocations), without taking
    /// either lock: from the per-slot caches (see the module docs), so it may lag a sample that
    /// is being recorded right now by that sample's growth.
    pub fn heap_bytes(&self) -> usize {
        let slots: usize = self.slot_heap.iter().map(|h| h.load(Relaxed)).sum();
        // Each slot's `Arc` allocation: two counters and the `Mutex<Profile>`.
        let arcs = 2 * (2 * std::mem::size_of::<usize>() + std::mem::size_of::<Mutex<Profile>>());
        let config: usize = self.config.value_types.capacity() * std::mem::size_of::<ValueType>()
            + self
                .config
                .value_types
                .iter()
                .map(|v| v.r#type.capacity() + v.unit.capacity())
                .sum::<usize>();
        slots + arcs + config + self.comments_heap.load(Relaxed)
    }

    /// 1 or 2: the slot samplers currently record into. For tests and debugging.
    pub fn active_slot(&self) -> u8 {
        self.active_slot.load(Relaxed)
    }

    /// Whether slot `1` or `2`'s lock is held. For tests and debugging.
    pub fn slot_is_locked(&self, slot: u8) -> bool {
        self.slots[usize::from(slot != 1)].is_locked()
    }

    pub fn stats(&self) -> StatsSnapshot {
        let s = &self.stats;
        StatsSnapshot {
            samples_recorded: s.samples_recorded.load(Relaxed),
            samples_rejected: s.samples_rejected.load(Relaxed),
            samples_dropped: s.samples_dropped.load(Relaxed),
            endpoints_dropped: s.endpoints_dropped.load(Relaxed),
            timestamps_dropped: s.timestamps_dropped.load(Relaxed),
            samples_lost: s.samples_lost.load(Relaxed),
            serializations: s.serializations.load(Relaxed),
            last_serialization_ns: s.last_serialization_ns.load(Relaxed),
            last_serialization_bytes: s.last_serialization_bytes.load(Relaxed),
        }
    }
}

/// Heap bytes of a comments list: the `Arc`'s block (two counters and the `String`s) and the
/// strings' bytes.
fn comments_heap_bytes(comments: &[String]) -> usize {
    2 * std::mem::size_of::<usize>()
        + std::mem::size_of_val(comments)
        + comments.iter().map(String::capacity).sum::<usize>()
}

/// Inherited recorders that a forked child could not drop (see [`Recorder::after_fork`]), kept
/// reachable so that leak checkers (valgrind, LeakSanitizer, Miri) see memory kept on purpose.
static KEPT_AFTER_FORK: std::sync::Mutex<Vec<Arc<Recorder>>> = std::sync::Mutex::new(Vec::new());

fn keep_after_fork(recorder: Arc<Recorder>) {
    // `try_lock`: a thread of the parent may have held it at the fork (a fork taken while
    // another child-to-be ran `after_fork`); then the recorder is leaked outright.
    match KEPT_AFTER_FORK.try_lock() {
        Ok(mut kept) => kept.push(recorder),
        Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner().push(recorder),
        Err(std::sync::TryLockError::WouldBlock) => std::mem::forget(recorder),
    }
}

impl PendingFlip<'_> {
    /// Flips the slots (see the module docs) and turns the previously active profile into
    /// `output`, then empties it and releases the serializer lock. Runs without the GVL in the
    /// binding.
    pub fn flip(self, output: Output) -> Result<Serialized, SerializeError> {
        let began = Instant::now();
        let Self { recorder, mut side, finish, comments } = self;
        let previously_inactive = side.inactive.take().ok_or(SerializeError::Inconsistent)?;
        let inactive_index =
            usize::from(Arc::ptr_eq(SlotGuard::mutex(&previously_inactive), &recorder.slots[1]));
        let active_index = 1 - inactive_index;
        drop(previously_inactive); // 1. samplers may now use it
        let profile = side.inactive.insert(recorder.slots[active_index].lock_arc()); // 2.
        recorder.active_slot.store(inactive_index as u8 + 1, Relaxed); // 3.

        let start = profile.start();
        let bytes = match output {
            Output::Pprof(compression) => {
                let value_types = &recorder.config.value_types;
                match compression {
                    Compression::None => Ok(pprof::encode(profile, value_types, &comments, finish)),
                    Compression::Gzip => {
                        pprof::encode_gzip(profile, value_types, &comments, finish)
                    }
                }
            }
            Output::Discard => Ok(Vec::new()),
        };
        // Emptied now rather than at the next flip: the memory is free for reuse meanwhile.
        profile.reset(finish);
        recorder.slot_heap[active_index].store(profile.heap_bytes(), Relaxed);
        drop(side);
        let bytes = bytes?;
        if output != Output::Discard {
            let stats = &recorder.stats;
            stats.serializations.fetch_add(1, Relaxed);
            stats.last_serialization_ns.store(began.elapsed().as_nanos() as u64, Relaxed);
            stats.last_serialization_bytes.store(bytes.len() as u64, Relaxed);
        }
        Ok(Serialized { start, finish, bytes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorder() -> Recorder {
        let config = Config::new(vec![ValueType::new("cpu-samples", "count")], 8).unwrap();
        Recorder::new(config, Timestamp::default())
    }

    /// A parent thread inside `set_comments` at the fork (its lock held for ever): the child
    /// does not wait for that lock (the test would hang) and starts without comments. A free
    /// lock: the child keeps the comments and frees the inherited recorder.
    #[test]
    fn a_comments_lock_held_at_the_fork_is_left_alone() {
        let mut r = Arc::new(recorder());
        r.set_comments(vec!["a comment".to_string()]).unwrap();
        std::mem::forget(r.comments.lock());
        Recorder::after_fork(&mut r, Timestamp::default());
        assert!(r.comments().is_empty());
        assert!(r.serialize(Compression::None).is_ok());

        let mut r = Arc::new(recorder());
        r.set_comments(vec!["a comment".to_string()]).unwrap();
        let inherited = Arc::downgrade(&r);
        Recorder::after_fork(&mut r, Timestamp::default());
        assert_eq!(&r.comments()[..], ["a comment"]);
        assert!(inherited.upgrade().is_none(), "a quiet recorder is freed");
        // The child's recorder has a lock of its own: the inherited one stays taken for good.
        r.set_comments(vec!["another".to_string()]).unwrap();
        assert_eq!(&r.comments()[..], ["another"]);
    }
}
