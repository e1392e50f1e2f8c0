//! What a profile holds, in numbers: the totals of its values, its label keys, the distinct
//! values of a label and its comments (the summary of `DdprofRecorder.summary` and
//! `ddprof-recorder summary`).
use std::collections::{BTreeSet, HashSet};

use super::reader::{ResolvedLabelValue, StackProfile};
use super::ViewError;

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

    /// The distinct label keys of the samples, sorted.
    pub fn label_keys(&self) -> Vec<String> {
        let keys: BTreeSet<&str> =
            self.samples.iter().flat_map(|s| s.labels.iter().map(|(k, _)| k.as_str())).collect();
        keys.into_iter().map(str::to_string).collect()
    }

    /// Fails with [`ViewError::UnknownLabel`] if the profile has samples and none has label
    /// `key`: a key to filter or group by that is not there is a typo more often than not.
    pub fn require_label(&self, key: &str) -> Result<(), ViewError> {
        if self.samples.is_empty()
            || self.samples.iter().any(|s| s.labels.iter().any(|(k, _)| k == key))
        {
            return Ok(());
        }
        Err(ViewError::UnknownLabel { key: key.to_string(), available: self.label_keys() })
    }

    /// The profile's comments, each once, in the order they first appear (a merge of several
    /// profiles already keeps each once: `merge`).
    pub fn distinct_comments(&self) -> Vec<String> {
        let mut seen = HashSet::new();
        self.comments.iter().filter(|c| seen.insert(c.as_str())).cloned().collect()
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
    fn label_keys_are_distinct_and_sorted_and_a_missing_key_names_them() {
        let mut p = example();
        assert_eq!(p.label_keys(), ["thread name"]);
        assert!(p.require_label("thread name").is_ok());
        let e = p.require_label("trace endpoint").unwrap_err();
        assert_eq!(
            e.to_string(),
            "no sample has a label \"trace endpoint\"; this profile's labels: thread name"
        );
        for s in &mut p.samples {
            s.labels.clear();
        }
        let e = p.require_label("thread name").unwrap_err();
        assert_eq!(
            e.to_string(),
            "no sample has a label \"thread name\"; this profile's samples have no labels"
        );
        // Without samples, nothing is missing: an empty profile is an empty answer.
        p.samples.clear();
        assert!(p.require_label("thread name").is_ok());
    }

    #[test]
    fn comments_are_distinct_in_first_appearance_order() {
        let mut p = example();
        assert!(p.distinct_comments().is_empty());
        p.comments = ["b", "a", "b", "c", "a"].map(String::from).into();
        assert_eq!(p.distinct_comments(), ["b", "a", "c"]);
    }

    #[test]
    fn totals_add_every_sample() {
        let p = example();
        assert_eq!((p.total(0), p.total(1)), (850, 1860));
    }
}
