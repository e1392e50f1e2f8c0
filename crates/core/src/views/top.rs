//! The "top" table: the functions holding the most of one value, self (as the leaf of a
//! sample) and total (anywhere in its stack, once per sample).
use std::collections::HashSet;

use super::reader::{ResolvedFunction, StackProfile};

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
}
