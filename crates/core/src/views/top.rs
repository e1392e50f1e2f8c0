//! The "top" tables: the functions holding the most of one value, self (as the leaf of a
//! sample) and total (anywhere in its stack, once per sample); or the values of a label
//! holding the most of it (`top --by "trace endpoint"`: which endpoint burns the CPU).
use std::collections::{HashMap, HashSet};

use super::reader::{ResolvedFunction, ResolvedLabelValue, StackProfile};
use super::ViewError;

/// One row of [`StackProfile::top`]: a function and the value it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopEntry {
    pub function: ResolvedFunction,
    /// Value of the samples whose leaf is this function.
    pub self_value: i64,
    /// Value of the samples with this function anywhere in their stack (once per sample, so
    /// recursion does not count twice).
    pub total_value: i64,
}

/// Which value [`StackProfile::top`] ranks by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TopSort {
    /// [`TopEntry::self_value`]: where the time is spent.
    #[default]
    SelfValue,
    /// [`TopEntry::total_value`]: what the time is spent under.
    TotalValue,
}

impl StackProfile {
    /// Functions ranked by `sort`'s value of `value`, highest first. One tie-break rule for
    /// both keys: then the other value, highest first, then name, then file. Functions with
    /// neither self nor total value are left out.
    pub fn top(&self, value: usize, sort: TopSort) -> Vec<TopEntry> {
        let mut self_values = vec![0i64; self.functions.len()];
        let mut total_values = vec![0i64; self.functions.len()];
        let mut seen = HashSet::new();
        for s in &self.samples {
            let v = s.values[value];
            if v == 0 {
                continue;
            }
            if let Some(&leaf) = s.frames.first() {
                self_values[leaf] = self_values[leaf].saturating_add(v);
            }
            seen.clear();
            for &f in &s.frames {
                if seen.insert(f) {
                    total_values[f] = total_values[f].saturating_add(v);
                }
            }
        }
        let mut rows: Vec<TopEntry> = self
            .functions
            .iter()
            .enumerate()
            .filter(|&(i, _)| self_values[i] != 0 || total_values[i] != 0)
            .map(|(i, f)| TopEntry {
                function: f.clone(),
                self_value: self_values[i],
                total_value: total_values[i],
            })
            .collect();
        let key = |r: &TopEntry| match sort {
            TopSort::SelfValue => (r.self_value, r.total_value),
            TopSort::TotalValue => (r.total_value, r.self_value),
        };
        rows.sort_by(|a, b| {
            key(b)
                .cmp(&key(a))
                .then_with(|| a.function.name.cmp(&b.function.name))
                .then_with(|| a.function.filename.cmp(&b.function.filename))
        });
        rows
    }
}

/// One row of [`StackProfile::top_by_label`]: a value of the label, or `None` for the samples
/// without it, and the sum of the asked value over its samples.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelTotal {
    pub label: Option<ResolvedLabelValue>,
    pub value: i64,
}

impl StackProfile {
    /// The sum of value `value` per value of label `key`, and one row (`label: None`) for the
    /// samples without it; highest first, ties by label value (a string before a number, the
    /// row without the label last). Each sample counts once, under its first `key` label (a
    /// pprof may repeat a key; the recorder never does), so the rows add up to
    /// [`Self::total`]. Rows of 0 are left out, as [`Self::top`] leaves out such functions.
    ///
    /// Fails with [`ViewError::UnknownLabel`] if no sample has the key
    /// ([`Self::require_label`]).
    pub fn top_by_label(&self, value: usize, key: &str) -> Result<Vec<LabelTotal>, ViewError> {
        self.require_label(key)?;
        let mut sums: HashMap<Option<&ResolvedLabelValue>, i64> = HashMap::new();
        for s in &self.samples {
            let label = s.labels.iter().find(|(k, _)| k == key).map(|(_, v)| v);
            let sum = sums.entry(label).or_insert(0);
            *sum = sum.saturating_add(s.values[value]);
        }
        let mut rows: Vec<LabelTotal> = sums
            .into_iter()
            .filter(|&(_, v)| v != 0)
            .map(|(label, value)| LabelTotal { label: label.cloned(), value })
            .collect();
        rows.sort_by(|a, b| {
            b.value.cmp(&a.value).then_with(|| match (&a.label, &b.label) {
                (Some(x), Some(y)) => x.cmp(y),
                (a, b) => b.is_some().cmp(&a.is_some()),
            })
        });
        Ok(rows)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_profiles::{profile, resolve};
    use super::*;

    fn rows(top: &[TopEntry]) -> Vec<(&str, i64, i64)> {
        top.iter().map(|r| (r.function.name.as_str(), r.self_value, r.total_value)).collect()
    }

    #[test]
    fn top_ranks_by_self_then_total_and_counts_recursion_once() {
        let p = resolve(profile(&[
            (&[3, 2, 1], [700, 0], "t"),
            (&[2, 3, 2, 1], [100, 0], "t"), // work recursing through spin
            (&[1], [5, 0], "t"),
        ]));
        let top = p.top(0, TopSort::SelfValue);
        assert_eq!(rows(&top), [("spin", 700, 800), ("work", 100, 800), ("main", 5, 805)]);
        assert_eq!(p.total(0), 805);
    }

    #[test]
    fn top_by_total_breaks_ties_by_self_then_name() {
        // main and work both hold 800 in all; work has more self. spin and sleep tie on both.
        let p = resolve(profile(&[
            (&[2, 1], [100, 0], "t"),
            (&[3, 2, 1], [350, 0], "t"),
            (&[4, 2, 1], [350, 0], "t"),
        ]));
        let by_total = p.top(0, TopSort::TotalValue);
        assert_eq!(
            rows(&by_total),
            [("work", 100, 800), ("main", 0, 800), ("sleep", 350, 350), ("spin", 350, 350)]
        );
        assert_eq!(
            rows(&p.top(0, TopSort::SelfValue)),
            [("sleep", 350, 350), ("spin", 350, 350), ("work", 100, 800), ("main", 0, 800)]
        );
    }

    #[test]
    fn top_by_label_sums_each_value_with_a_row_for_samples_without_it() {
        let mut p = resolve(profile(&[
            (&[3, 2, 1], [700, 800], "worker"),
            (&[2, 1], [100, 100], "worker"),
            (&[3, 2, 1], [100, 60], "other"),
            (&[4, 1], [0, 900], "sleeper"),
            (&[4, 1], [50, 5], "x"),
        ]));
        p.samples[4].labels.clear();
        let rows = |p: &StackProfile, v| -> Vec<(Option<String>, i64)> {
            let rows = p.top_by_label(v, "thread name").unwrap();
            rows.into_iter().map(|r| (r.label.map(|l| l.to_string()), r.value)).collect()
        };
        let worker = Some("worker".to_string());
        let other = Some("other".to_string());
        // sleeper has no cpu-time: left out; the rows add up to the total.
        assert_eq!(rows(&p, 0), [(worker.clone(), 800), (other.clone(), 100), (None, 50)]);
        assert_eq!(p.total(0), 950);
        assert_eq!(rows(&p, 1)[0], (Some("sleeper".to_string()), 900));
        // Ties: by value, the row without the label last.
        p.samples[4].values[0] = 100;
        assert_eq!(rows(&p, 0)[1..], [(other, 100), (None, 100)]);

        let e = p.top_by_label(0, "trace endpoint").unwrap_err();
        assert!(matches!(e, ViewError::UnknownLabel { .. }), "{e}");
    }

    #[test]
    fn top_by_a_numeric_label_sorts_its_numbers() {
        let mut p =
            resolve(profile(&[(&[1], [5, 0], "a"), (&[2], [5, 0], "a"), (&[3], [7, 0], "a")]));
        for (s, pid) in p.samples.iter_mut().zip([12, 3, 40]) {
            s.labels = vec![("process id".to_string(), ResolvedLabelValue::Num(pid))];
        }
        let rows = p.top_by_label(0, "process id").unwrap();
        let rows: Vec<(String, i64)> =
            rows.into_iter().map(|r| (r.label.unwrap().to_string(), r.value)).collect();
        assert_eq!(rows, [("40".to_string(), 7), ("3".to_string(), 5), ("12".to_string(), 5)]);
    }
}
