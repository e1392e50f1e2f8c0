//! What a profile holds, in numbers: the totals of its values and the distinct values of a
//! label (the summary of `DdprofRecorder.summary` and `ddprof-recorder summary`).
use std::collections::HashSet;

use super::reader::{ResolvedLabelValue, StackProfile};

impl StackProfile {
    /// Sum of value `value` over all samples (saturating, like the recorder's sums).
    pub fn total(&self, value: usize) -> i64 {
        self.samples.iter().fold(0i64, |acc, s| acc.saturating_add(s.values[value]))
    }

    /// The distinct values of label `key` over all samples, sorted.
    pub fn label_values(&self, key: &str) -> Vec<ResolvedLabelValue> {
        let mut values: Vec<ResolvedLabelValue> = self
            .samples
            .iter()
            .flat_map(|s| s.labels.iter().filter(|(k, _)| k == key).map(|(_, v)| v.clone()))
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        values.sort();
        values
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_profiles::example;

    #[test]
    fn label_values_are_distinct_and_sorted() {
        let p = example();
        let names: Vec<String> =
            p.label_values("thread name").iter().map(ToString::to_string).collect();
        assert_eq!(names, ["other", "sleeper", "worker"]);
        assert!(p.label_values("nope").is_empty());
    }

    #[test]
    fn totals_add_every_sample() {
        let p = example();
        assert_eq!((p.total(0), p.total(1)), (850, 1860));
    }
}
