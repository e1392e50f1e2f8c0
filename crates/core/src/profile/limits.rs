//! The per-profile [`Limits`], and what a sample over them becomes.
use super::frames::hash_frame;
use super::labels::{StoredLabel, StoredValue};
use super::stacks::push_varint;
use super::Profile;
use crate::hash::{hash_bytes, hash_u32s};
use crate::sample::{Frame, Label, LabelValue, Sample};
use crate::strings::StringTable;
use crate::DROPPED_FRAME;

/// Per-profile bounds on distinct content: what bounds a profile's memory. A sample that would
/// need more folds into the [`DROPPED_FRAME`] placeholder sample instead (its values are kept,
/// so totals stay exact); an endpoint that would need more is dropped. What a sample needs
/// that the profile already holds is always reused. The placeholder itself is stored whatever
/// the limits (it may add one string, stack, label set and sample past them), and once stored
/// counts toward them like any other entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Distinct stacks.
    pub max_stacks: usize,
    /// Distinct strings (function names, filenames, label keys and values, endpoints).
    pub max_strings: usize,
    /// Distinct label sets; also the most endpoints a profile keeps.
    pub max_label_sets: usize,
    /// Distinct (stack, label set) pairs: the aggregated samples of the pprof.
    pub max_samples: usize,
    /// Timed samples (those with an [`END_TIMESTAMP_LABEL`](crate::END_TIMESTAMP_LABEL)),
    /// each kept apart. One over this is aggregated without its time instead (counted in
    /// [`Profile::timestamps_dropped`]): its values stay in the totals.
    pub max_timed_samples: usize,
}

impl Limits {
    /// Largest accepted value of any limit: ids are `u32`s.
    pub const MAX: usize = u32::MAX as usize - 16;

    /// Generous enough that the large workload of bench/gen_workload.rb (2M samples: 124k
    /// stacks, 35k strings, 859k label sets) is never folded; at these bounds a profile of
    /// 60-frame stacks holds on the order of 500 MB. A million timed samples (a minute of 99
    /// samples a second on 168 threads) take 16 bytes and 8 per value each: 40 MB with three
    /// values.
    pub const DEFAULT: Limits = Limits {
        max_stacks: 1_000_000,
        max_strings: 1_000_000,
        max_label_sets: 1_000_000,
        max_samples: 4_000_000,
        max_timed_samples: 1_000_000,
    };

    /// Checks every limit is in `1..=Limits::MAX`.
    pub fn validate(&self) -> Result<(), crate::ConfigError> {
        for (name, value) in [
            ("max_stacks", self.max_stacks),
            ("max_strings", self.max_strings),
            ("max_label_sets", self.max_label_sets),
            ("max_samples", self.max_samples),
            ("max_timed_samples", self.max_timed_samples),
        ] {
            if !(1..=Self::MAX).contains(&value) {
                return Err(crate::ConfigError::Limit { name, value });
            }
        }
        Ok(())
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl Profile {
    /// Folds a sample's values into the placeholder sample: one [`DROPPED_FRAME`] frame, no
    /// labels. Stored whatever the limits (at most one more of each kind).
    #[cold]
    pub(super) fn add_dropped(&mut self, values: &[i64]) {
        // Not through `intern_frame`: a second call site changed how the hot loop's copy is
        // optimized. Callgrind, `bench/run core small --only core-add`: 255.0M instructions
        // before limits, 280.7M with this call, 256.9M without it (2026-11-30).
        let location = match self.find_frame(DROPPED_FRAME, "", 0) {
            Some(location) => location,
            None => self.add_frame(hash_frame(DROPPED_FRAME, "", 0), DROPPED_FRAME, "", 0),
        };
        let mut stack = std::mem::take(&mut self.scratch_stack);
        stack.clear();
        push_varint(&mut stack, u64::from(location) + 1);
        let stack_id = self.stacks.intern(&stack, hash_bytes);
        self.scratch_stack = stack;
        let label_set = self.intern_labels(&[]);
        self.add_values(stack_id, label_set, values);
        self.samples_added += 1;
        self.samples_dropped += 1;
    }

    /// The exact limit check, for a profile near a limit: whether storing the sample (its `kept`
    /// frames of `total`; `timed`: kept apart, so no aggregated sample) stays within every
    /// limit. Looks everything up, changes nothing.
    #[cold]
    #[inline(never)]
    pub(super) fn fits(&self, sample: &Sample<'_>, kept: usize, total: usize, timed: bool) -> bool {
        let mut new_strings = NewStrings { strings: &self.strings, new: Vec::new() };
        let stack_id = self.find_stack(&sample.frames[..kept], total, &mut new_strings);
        let set_id = self.find_label_set(sample.labels, &mut new_strings);
        let new_sample = match (stack_id, set_id) {
            _ if timed => false,
            (Some(stack), Some(set)) => self.find_sample((stack, set)).is_none(),
            _ => true,
        };
        let limits = &self.limits;
        // What the sample needs anew must fit; what exists is always reused (a profile at a
        // limit still aggregates samples it already holds).
        let room = |len: usize, new: usize, max: usize| new == 0 || len + new <= max;
        room(self.strings.len(), new_strings.new.len(), limits.max_strings)
            && room(self.stacks.len(), usize::from(stack_id.is_none()), limits.max_stacks)
            && room(self.label_sets.len(), usize::from(set_id.is_none()), limits.max_label_sets)
            && room(self.samples.len(), usize::from(new_sample), limits.max_samples)
    }

    /// For [`Profile::fits`]: the id of the stack of `kept` frames (of `total`, the rest becoming
    /// the placeholder), if the profile holds it; notes the strings its new frames would add.
    fn find_stack(
        &self,
        kept: &[Frame<'_>],
        total: usize,
        new_strings: &mut NewStrings<'_>,
    ) -> Option<u32> {
        let mut stack = Vec::new();
        let mut new_stack = false;
        let omitted = total - kept.len();
        let placeholder = (omitted > 0).then(|| format!("{omitted} frames omitted"));
        let frames = kept
            .iter()
            .map(|f| (f.function_name, f.filename, f.line))
            .chain(placeholder.as_deref().map(|name| ("", name, 0)));
        for (name, filename, line) in frames {
            match self.find_frame(name, filename, line) {
                Some(location) => push_varint(&mut stack, u64::from(location) + 1),
                None => {
                    new_stack = true;
                    new_strings.note(name);
                    new_strings.note(filename);
                }
            }
        }
        if new_stack {
            None
        } else {
            self.stacks.find(&stack, hash_bytes)
        }
    }

    /// For [`Profile::fits`]: the id of the set of `labels`, if the profile holds it; notes the
    /// strings its new labels would add.
    fn find_label_set(
        &self,
        labels: &[Label<'_>],
        new_strings: &mut NewStrings<'_>,
    ) -> Option<u32> {
        let mut ids = Vec::with_capacity(labels.len());
        let mut new_set = false;
        for label in labels.iter().filter(|l| !super::timed::is_end_timestamp(l)) {
            let key = self.strings.lookup(label.key);
            if key.is_none() {
                new_strings.note(label.key);
            }
            let value = match label.value {
                LabelValue::Num(n) => Some(StoredValue::Num(n)),
                LabelValue::Str(v) => {
                    let id = self.strings.lookup(v);
                    if id.is_none() {
                        new_strings.note(v);
                    }
                    id.map(StoredValue::Str)
                }
            };
            match (key, value) {
                (Some(key), Some(value)) => match self.find_label(StoredLabel { key, value }) {
                    Some(id) => ids.push(id),
                    None => new_set = true,
                },
                _ => new_set = true,
            }
        }
        if new_set {
            return None;
        }
        ids.sort_unstable();
        self.label_sets.find(&ids, hash_u32s)
    }
}

/// The strings a sample would add to the profile, each once (a slow path: allocating is fine).
struct NewStrings<'a> {
    strings: &'a StringTable,
    new: Vec<String>,
}

impl NewStrings<'_> {
    fn note(&mut self, s: &str) {
        if self.strings.lookup(s).is_none() && !self.new.iter().any(|n| n == s) {
            self.new.push(s.to_owned());
        }
    }
}
