//! Keeping part of a profile: the samples whose labels have given values, e.g. the one thread
//! that served the request `DdprofRecorder::Rack` profiled (`"thread id"`), or one process of
//! a merged profile (`"process id"`).
//!
//! Only samples go: locations, functions and strings stay as they were, used or not (pprof
//! allows that, and every reader ignores them), so the output is the input with fewer samples.
use super::reader::{decode, ReadLimits, ResolvedLabelValue};
use super::ViewError;
use crate::pprof::PprofProfile;

/// Decodes `bytes` (a pprof, raw or gzip, within `limits`) and keeps the samples that have
/// every label of `labels`: the same key with the same value, a string label for
/// [`ResolvedLabelValue::Str`] and a numeric one for [`ResolvedLabelValue::Num`].
pub fn filter_bytes(
    bytes: &[u8],
    labels: &[(String, ResolvedLabelValue)],
    limits: &ReadLimits,
) -> Result<PprofProfile, ViewError> {
    let mut profile = decode(bytes, limits)?;
    filter(&mut profile, labels)?;
    Ok(profile)
}

/// Keeps the samples of `profile` that have every label of `labels` (see [`filter_bytes`]).
pub fn filter(
    profile: &mut PprofProfile,
    labels: &[(String, ResolvedLabelValue)],
) -> Result<(), ViewError> {
    let strings = &profile.string_table;
    let string = |index: i64, what: &str| -> Result<&str, ViewError> {
        usize::try_from(index).ok().and_then(|i| strings.get(i)).map(String::as_str).ok_or_else(
            || ViewError::NotPprof(format!("{what} refers to string {index}, past the table")),
        )
    };
    let mut keep = Vec::with_capacity(profile.sample.len());
    for sample in &profile.sample {
        let mut matched = 0;
        for (key, value) in labels {
            for label in &sample.label {
                if string(label.key, "a label key")? != key {
                    continue;
                }
                let equal = match value {
                    ResolvedLabelValue::Str(s) => {
                        label.str != 0 && string(label.str, "a label value")? == s
                    }
                    ResolvedLabelValue::Num(n) => label.str == 0 && label.num == *n,
                };
                if equal {
                    matched += 1;
                    break;
                }
            }
        }
        keep.push(matched == labels.len());
    }
    let mut keep = keep.into_iter();
    profile.sample.retain(|_| keep.next().unwrap_or(false));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pprof::{
        PprofFunction, PprofLabel, PprofLine, PprofLocation, PprofSample, PprofValueType,
    };
    use crate::views::{FoldOptions, StackProfile};
    use prost::Message as _;

    /// Samples `(function name, value, thread id, pid)` on one-frame stacks.
    fn profile(samples: &[(&str, i64, &str, i64)]) -> PprofProfile {
        let mut strings: Vec<String> =
            ["", "cpu-time", "nanoseconds", "thread id", "process id"].map(String::from).to_vec();
        let mut intern = |s: &str| -> i64 {
            if let Some(i) = strings.iter().position(|x| x == s) {
                return i as i64;
            }
            strings.push(s.to_string());
            strings.len() as i64 - 1
        };
        let mut p = PprofProfile {
            sample_type: vec![PprofValueType { r#type: 1, unit: 2 }],
            ..Default::default()
        };
        for (i, &(name, value, thread, pid)) in samples.iter().enumerate() {
            let id = i as u64 + 1;
            let name = intern(name);
            p.function.push(PprofFunction { id, name, ..Default::default() });
            p.location.push(PprofLocation {
                id,
                line: vec![PprofLine { function_id: id, line: 1 }],
                ..Default::default()
            });
            let thread = intern(thread);
            p.sample.push(PprofSample {
                location_id: vec![id],
                value: vec![value],
                label: vec![
                    PprofLabel { key: 3, str: thread, num: 0, num_unit: 0 },
                    PprofLabel { key: 4, str: 0, num: pid, num_unit: 0 },
                ],
            });
        }
        p.string_table = strings;
        p
    }

    fn folded(p: &PprofProfile) -> String {
        let p = StackProfile::from_bytes(&p.encode_to_vec(), &ReadLimits::default()).unwrap();
        p.folded(0, &FoldOptions::default()).unwrap()
    }

    #[test]
    fn keeps_the_samples_with_every_label() {
        let bytes = profile(&[("a", 1, "7 (1)", 10), ("b", 2, "8 (2)", 10), ("c", 4, "7 (1)", 11)])
            .encode_to_vec();
        let thread = |t: &str| ("thread id".to_string(), ResolvedLabelValue::Str(t.to_string()));
        let pid = |n| ("process id".to_string(), ResolvedLabelValue::Num(n));
        let keep = |labels: &[(String, ResolvedLabelValue)]| {
            folded(&filter_bytes(&bytes, labels, &ReadLimits::default()).unwrap())
        };

        assert_eq!(keep(&[thread("7 (1)")]), "a 1\nc 4\n");
        assert_eq!(keep(&[thread("7 (1)"), pid(11)]), "c 4\n");
        assert_eq!(keep(&[pid(10)]), "a 1\nb 2\n");
        assert_eq!(keep(&[]), "a 1\nb 2\nc 4\n");
        // A string never equals a number, nor a missing label anything.
        let as_string = ("process id".to_string(), ResolvedLabelValue::Str("10".to_string()));
        assert_eq!(keep(&[as_string]), "");
        let other = ("span".to_string(), ResolvedLabelValue::Num(1));
        assert_eq!(keep(&[other]), "");
    }

    #[test]
    fn rejects_labels_past_the_string_table() {
        let mut p = profile(&[("a", 1, "7 (1)", 10)]);
        p.sample[0].label[0].key = 99;
        let thread = ("thread id".to_string(), ResolvedLabelValue::Str("7 (1)".to_string()));
        let e = filter_bytes(&p.encode_to_vec(), &[thread], &ReadLimits::default()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "not a pprof profile: a label key refers to string 99, past the table"
        );
    }
}
