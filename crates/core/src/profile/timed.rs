//! Timed samples: those that carry an [`END_TIMESTAMP_LABEL`], each kept apart with its end
//! time rather than aggregated, so that a timeline can place it. Their stacks and other labels
//! are interned as every sample's are; only the time and the values are per sample, so one
//! costs 16 bytes and 8 per value. Over [`Limits::max_timed_samples`](super::Limits) a timed
//! sample is aggregated without its time (counted in [`Profile::timestamps_dropped`]): the
//! totals stay exact, only the timeline thins.
use super::Profile;
use crate::sample::{Label, LabelValue};
use crate::END_TIMESTAMP_LABEL;

/// One timed sample: its stack, its label set (without the time) and its end time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TimedSample {
    pub stack: u32,
    pub label_set: u32,
    /// Unix nanoseconds.
    pub end_ns: i64,
}

/// The end time a sample's labels give it, if any (validated: a number, 0 or more).
#[inline]
pub(super) fn end_timestamp(labels: &[Label<'_>]) -> Option<i64> {
    labels.iter().find(|l| l.key == END_TIMESTAMP_LABEL).and_then(|l| match l.value {
        LabelValue::Num(n) => Some(n),
        LabelValue::Str(_) => None,
    })
}

/// Whether `label` is a sample's end time, which is not part of its label set.
#[inline]
pub(super) fn is_end_timestamp(label: &Label<'_>) -> bool {
    label.key == END_TIMESTAMP_LABEL
}

impl Profile {
    /// Whether a sample ending at `end_ns` (None: not a timed sample) is kept apart: it has a
    /// time and the profile has room for one more.
    #[inline]
    pub(super) fn keeps_timed(&self, end_ns: Option<i64>) -> bool {
        end_ns.is_some() && self.timed.len() < self.limits.max_timed_samples
    }

    pub(super) fn push_timed(&mut self, stack: u32, label_set: u32, end_ns: i64, values: &[i64]) {
        self.timed.push(TimedSample { stack, label_set, end_ns });
        self.timed_values.extend_from_slice(values);
    }

    /// Timed samples kept apart, in the order they were added.
    pub fn timed_sample_count(&self) -> usize {
        self.timed.len()
    }

    /// Timed samples over [`Limits::max_timed_samples`](super::Limits), aggregated without their
    /// time, since the last reset.
    pub fn timestamps_dropped(&self) -> u64 {
        self.timestamps_dropped
    }

    /// Timed sample `i`'s values.
    pub(crate) fn timed_values(&self, i: usize) -> &[i64] {
        let n = self.num_values();
        &self.timed_values[i * n..(i + 1) * n]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::RecordError;
    use crate::profile::Limits;
    use crate::sample::{Frame, Sample};
    use crate::time::Timestamp;

    const FRAMES: [Frame<'static>; 1] = [Frame { function_name: "a", filename: "a.rb", line: 1 }];

    fn at(ns: i64) -> Label<'static> {
        Label { key: END_TIMESTAMP_LABEL, value: LabelValue::Num(ns) }
    }

    fn add(p: &mut Profile, labels: &[Label<'_>], values: &[i64]) -> Result<(), RecordError> {
        p.add(&Sample { frames: &FRAMES, omitted_frames: 0, values, labels }, 10)
    }

    fn totals(p: &Profile) -> (Vec<i64>, usize) {
        let mut sum = vec![0; p.num_values()];
        let mut with_time = 0;
        p.for_each_sample(|_, values, labels| {
            sum.iter_mut().zip(values).for_each(|(s, v)| *s += v);
            with_time += labels.iter().filter(|l| l.key == END_TIMESTAMP_LABEL).count();
        });
        (sum, with_time)
    }

    #[test]
    fn over_the_limit_a_timed_sample_is_aggregated_without_its_time() {
        let limits = Limits { max_timed_samples: 2, ..Limits::DEFAULT };
        let mut p = Profile::with_limits(1, Timestamp::default(), limits);
        for ns in 1..=5 {
            add(&mut p, &[at(ns)], &[10]).unwrap();
        }
        assert_eq!((p.timed_sample_count(), p.sample_count()), (2, 1));
        assert_eq!(p.timestamps_dropped(), 3);
        assert_eq!(p.samples_added(), 5);
        assert_eq!(totals(&p), (vec![50], 2), "every value kept, two times");
        p.reset(Timestamp::default());
        assert_eq!((p.timed_sample_count(), p.timestamps_dropped()), (0, 0));
    }

    #[test]
    fn a_timed_sample_needs_no_room_for_an_aggregated_one() {
        let limits = Limits { max_samples: 1, ..Limits::DEFAULT };
        let mut p = Profile::with_limits(1, Timestamp::default(), limits);
        add(&mut p, &[Label { key: "k", value: LabelValue::Num(1) }], &[1]).unwrap();
        add(&mut p, &[at(7)], &[2]).unwrap();
        assert_eq!(p.samples_dropped(), 0);
        assert_eq!((p.timed_sample_count(), p.sample_count()), (1, 1));
        // Untimed, the same sample needs a second aggregated one: folded.
        add(&mut p, &[], &[4]).unwrap();
        assert_eq!(p.samples_dropped(), 1);
    }

    #[test]
    fn a_time_is_a_number_zero_or_more() {
        let mut p = Profile::new(1, Timestamp::default());
        let text = Label { key: END_TIMESTAMP_LABEL, value: LabelValue::Str("5") };
        assert_eq!(add(&mut p, &[text], &[1]), Err(RecordError::BadEndTimestamp));
        assert_eq!(add(&mut p, &[at(-1)], &[1]), Err(RecordError::BadEndTimestamp));
        assert_eq!((p.samples_added(), p.string_count()), (0, 1), "nothing recorded");
        add(&mut p, &[at(0)], &[1]).unwrap();
        assert_eq!(p.timed_sample_count(), 1);
    }
}
