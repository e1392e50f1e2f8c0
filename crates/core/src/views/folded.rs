//! Folded stacks, the format of Brendan Gregg's `flamegraph.pl` and of
//! [inferno](https://github.com/jonhoo/inferno): one line per distinct stack, root first,
//! frames separated by `;`, then a space and the stack's value.
use std::collections::BTreeMap;
use std::mem::size_of;

use super::reader::{sanitize, ResolvedLabelValue, StackProfile, NO_STACK};
use super::ViewError;

/// How [`StackProfile::folded`] writes frames.
#[derive(Debug, Clone, Default)]
pub struct FoldOptions {
    /// Add ` (file)` after each function name, to tell apart same-named functions.
    pub filenames: bool,
    /// Put the value of this label (e.g. `"thread name"`) as the root-most frame, so that the
    /// flamegraph has one tower per value ([`group_name`]: `key=value`, and `(no key)` for the
    /// samples without the label).
    pub root_label: Option<String>,
    /// Cut each name at [`super::MAX_DRAWN_NAME_CHARS`] (the flamegraph, which draws them).
    pub cut_names: bool,
}

/// What a group of samples by label `key` is called (the root frame under
/// [`FoldOptions::root_label`], a speedscope profile's name): `key=value`, e.g. `thread
/// name=main`, or `(no key)` for the samples without the label.
pub(crate) fn group_name(key: &str, labels: &[(String, ResolvedLabelValue)]) -> String {
    match labels.iter().find(|(k, _)| k == key) {
        Some((_, value)) => format!("{key}={value}"),
        None => format!("(no {key})"),
    }
}

/// What the folded text of one distinct stack costs beyond its line: the map's entry.
const ENTRY_BYTES: usize = size_of::<(String, i64)>();

impl StackProfile {
    /// Folded stacks for value `value`: `root;...;leaf value` lines, sorted, one per distinct
    /// stack (samples that differ only by labels are merged), without stacks whose value is 0.
    /// An empty stack is written as the single frame `(no stack)`.
    ///
    /// Fails with [`ViewError::OutputTooLarge`] if the text would take more than the profile's
    /// output bound (names repeated down deep stacks add up), and with
    /// [`ViewError::UnknownLabel`] if no sample has the [`FoldOptions::root_label`].
    pub fn folded(&self, value: usize, options: &FoldOptions) -> Result<String, ViewError> {
        if let Some(key) = &options.root_label {
            self.require_label(key)?;
        }
        let mut budget = self.output_budget;
        let names: Vec<String> = (0..self.functions.len())
            .map(|f| {
                let name = self.frame_name(f, options.filenames);
                if options.cut_names {
                    super::reader::drawn_name(&name).into_owned()
                } else {
                    name
                }
            })
            .collect();
        let mut stacks: BTreeMap<String, i64> = BTreeMap::new();
        let mut line = String::new();
        for s in &self.samples {
            let v = s.values[value];
            if v == 0 {
                continue;
            }
            line.clear();
            if let Some(key) = &options.root_label {
                line.push_str(&sanitize(&group_name(key, &s.labels)));
            }
            // Measured before it is written: one line alone can be what exhausts the budget.
            let len = s.frames.iter().fold(line.len() + NO_STACK.len(), |len, &f| {
                len.saturating_add(names[f].len() + 1)
            });
            budget.check_usize(len, "the folded stacks")?;
            if s.frames.is_empty() {
                if !line.is_empty() {
                    line.push(';');
                }
                line.push_str(NO_STACK);
            }
            for &f in s.frames.iter().rev() {
                if !line.is_empty() {
                    line.push(';');
                }
                line.push_str(&names[f]);
            }
            match stacks.get_mut(&line) {
                Some(sum) => *sum = sum.saturating_add(v),
                None => {
                    // Twice: the map's key, then the output's line.
                    budget.charge_usize(2 * (line.len() + ENTRY_BYTES), "the folded stacks")?;
                    stacks.insert(line.clone(), v);
                }
            }
        }
        let mut out = String::with_capacity(stacks.len() * 64);
        for (stack, v) in stacks {
            if v != 0 {
                out.push_str(&stack);
                out.push(' ');
                out.push_str(&v.to_string());
                out.push('\n');
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_profiles::{example, profile, resolve};
    use super::*;
    use crate::pprof::{PprofLine, PprofLocation, PprofSample};

    #[test]
    fn folds_root_first_merging_label_sets_and_skipping_zero_values() {
        let p = example();
        let cpu = p.value_index("cpu-time").unwrap();
        assert_eq!(
            p.folded(cpu, &FoldOptions::default()).unwrap(),
            "main;work 100\nmain;work;spin 750\n"
        );
        let wall = p.value_index("wall-time").unwrap();
        assert_eq!(
            p.folded(wall, &FoldOptions::default()).unwrap(),
            "main;sleep 900\nmain;work 100\nmain;work;spin 860\n"
        );
    }

    #[test]
    fn folds_with_a_label_as_root_and_filenames() {
        let p = example();
        let options = FoldOptions {
            filenames: true,
            root_label: Some("thread name".to_string()),
            ..Default::default()
        };
        assert_eq!(
            p.folded(0, &options).unwrap(),
            "thread name=other;main (a.rb);work (a.rb);spin (a.rb) 50\n\
             thread name=worker;main (a.rb);work (a.rb) 100\n\
             thread name=worker;main (a.rb);work (a.rb);spin (a.rb) 700\n"
        );
    }

    #[test]
    fn a_group_label_that_some_samples_lack_is_their_own_root_and_one_none_has_an_error() {
        let mut p = example();
        p.samples[2].labels.clear();
        let by =
            |key: &str| FoldOptions { root_label: Some(key.to_string()), ..Default::default() };
        assert_eq!(
            p.folded(0, &by("thread name")).unwrap(),
            "(no thread name);main;work;spin 50\n\
             thread name=worker;main;work 100\n\
             thread name=worker;main;work;spin 700\n"
        );
        let e = p.folded(0, &by("trace endpoint")).unwrap_err();
        assert!(matches!(e, ViewError::UnknownLabel { .. }), "{e}");
    }

    #[test]
    fn inline_lines_become_frames_and_odd_names_are_made_safe() {
        let mut p = profile(&[(&[1], [3, 0], "t"), (&[], [4, 0], "t")]);
        p.string_table[4] = "a;b\nc".to_string();
        p.location[0].line.insert(0, PprofLine { function_id: 2, line: 3 });
        p.function[2].name = 0; // spin: empty name and empty file
        p.function[2].filename = 0;
        p.location.push(PprofLocation { id: 9, address: 0xab, ..Default::default() });
        p.sample.push(PprofSample { location_id: vec![9, 3], value: vec![2, 0], label: vec![] });
        let p = resolve(p);
        assert_eq!(
            p.folded(0, &FoldOptions::default()).unwrap(),
            "(no stack) 4\n(unknown);0xab 2\na:b c;work 3\n"
        );
    }

    #[test]
    fn omitted_frames_placeholder_shows_its_file() {
        // The recorder's placeholder is the root-most frame, with only a filename.
        let mut p = profile(&[(&[1, 2], [1, 1], "t")]);
        p.string_table.push("3 frames omitted".to_string());
        p.function[1].name = 0;
        p.function[1].filename = p.string_table.len() as i64 - 1;
        let p = resolve(p);
        assert_eq!(p.folded(0, &FoldOptions::default()).unwrap(), "3 frames omitted;main 1\n");
    }
}
