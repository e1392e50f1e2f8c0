//! Keeping part of a profile: the samples whose labels have given values, e.g. the one thread
//! that served the request `DdprofRecorder::Rack` profiled (`"thread id"`), one process of a
//! merged profile (`"process id"`), or one endpoint (`"trace endpoint"`, the views' `--label
//! KEY=VALUE` and `label:`).
//!
//! A [`LabelFilter`] is a key and a value to match: [`LabelMatch::Exact`] is typed (a string
//! label for a string, a numeric label for a number: `DdprofRecorder.filter`'s `labels:`),
//! [`LabelMatch::Text`] is what a command line can say, the value as text: a string label of
//! that text, or a numeric label written so in decimal (`process id=11`).
//!
//! On a decoded pprof ([`filter`], [`filter_matching`]) only samples go: locations, functions
//! and strings stay as they were, used or not (pprof allows that, and every reader ignores
//! them), so the output is the input with fewer samples. On a resolved profile
//! ([`StackProfile::keep_labels`]) the views that follow see only the kept samples, and know
//! what was kept ([`StackProfile::filtered`]) to say so when nothing was.
//!
//! A key that no sample of a profile has is an error ([`ViewError::UnknownLabel`], naming the
//! keys it has) for [`filter_matching`] and [`StackProfile::keep_labels`]: it is a typo far
//! more often than a question. A key that is there with a value no sample has keeps nothing,
//! an answer. A profile without samples has no keys to check: it stays empty.
use std::collections::BTreeSet;
use std::fmt;

use super::reader::{decode, ReadLimits, ResolvedLabelValue, StackProfile};
use super::ViewError;
use crate::pprof::PprofProfile;

/// What value a [`LabelFilter`]'s label must have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelMatch {
    /// This value, of this type: a string never equals a number.
    Exact(ResolvedLabelValue),
    /// This text: a string label equal to it, or a numeric label whose decimal form it is.
    Text(String),
}

/// Keeps the samples whose label `key` has the value `value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelFilter {
    pub key: String,
    pub value: LabelMatch,
}

impl LabelFilter {
    /// A filter on `key`'s value as text ([`LabelMatch::Text`]).
    pub fn text(key: impl Into<String>, value: impl Into<String>) -> Self {
        Self { key: key.into(), value: LabelMatch::Text(value.into()) }
    }

    /// A typed filter ([`LabelMatch::Exact`]).
    pub fn exact(key: impl Into<String>, value: ResolvedLabelValue) -> Self {
        Self { key: key.into(), value: LabelMatch::Exact(value) }
    }

    /// Whether a label's value matches.
    pub fn matches(&self, value: &ResolvedLabelValue) -> bool {
        match (&self.value, value) {
            (LabelMatch::Exact(want), got) => want == got,
            (LabelMatch::Text(want), ResolvedLabelValue::Str(got)) => want == got,
            (LabelMatch::Text(want), ResolvedLabelValue::Num(got)) => *want == got.to_string(),
        }
    }
}

/// `key=value`, as the command line takes it.
impl fmt::Display for LabelFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.value {
            LabelMatch::Exact(v) => write!(f, "{}={v}", self.key),
            LabelMatch::Text(v) => write!(f, "{}={v}", self.key),
        }
    }
}

/// `filters` as people read them: `a=1 and b=2`.
pub(crate) fn describe(filters: &[LabelFilter]) -> String {
    filters.iter().map(ToString::to_string).collect::<Vec<_>>().join(" and ")
}

/// The error of a key no sample has, naming the keys there are (sorted).
fn unknown_label(key: &str, available: BTreeSet<&str>) -> ViewError {
    ViewError::UnknownLabel {
        key: key.to_string(),
        available: available.into_iter().map(str::to_string).collect(),
    }
}

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

/// Keeps the samples of `profile` that have every label of `labels` (see [`filter_bytes`]),
/// whether their keys are in the profile or not.
pub fn filter(
    profile: &mut PprofProfile,
    labels: &[(String, ResolvedLabelValue)],
) -> Result<(), ViewError> {
    let filters: Vec<LabelFilter> =
        labels.iter().map(|(k, v)| LabelFilter::exact(k.clone(), v.clone())).collect();
    retain(profile, &filters, false)
}

/// Keeps the samples of `profile` that match every filter of `filters`; a key that no sample
/// has is [`ViewError::UnknownLabel`] (see the module doc).
pub fn filter_matching(
    profile: &mut PprofProfile,
    filters: &[LabelFilter],
) -> Result<(), ViewError> {
    retain(profile, filters, true)
}

fn retain(
    profile: &mut PprofProfile,
    filters: &[LabelFilter],
    require_keys: bool,
) -> Result<(), ViewError> {
    if filters.is_empty() {
        return Ok(());
    }
    let strings = &profile.string_table;
    let string = |index: i64, what: &str| -> Result<&str, ViewError> {
        usize::try_from(index).ok().and_then(|i| strings.get(i)).map(String::as_str).ok_or_else(
            || ViewError::NotPprof(format!("{what} refers to string {index}, past the table")),
        )
    };
    let mut keys = BTreeSet::new();
    let mut keep = Vec::with_capacity(profile.sample.len());
    for sample in &profile.sample {
        for label in &sample.label {
            keys.insert(string(label.key, "a label key")?);
        }
        let mut all = true;
        for f in filters {
            let mut any = false;
            for label in &sample.label {
                if string(label.key, "a label key")? != f.key {
                    continue;
                }
                any = if label.str != 0 {
                    let value = string(label.str, "a label value")?;
                    match &f.value {
                        LabelMatch::Exact(ResolvedLabelValue::Str(want))
                        | LabelMatch::Text(want) => want == value,
                        LabelMatch::Exact(ResolvedLabelValue::Num(_)) => false,
                    }
                } else {
                    f.matches(&ResolvedLabelValue::Num(label.num))
                };
                if any {
                    break;
                }
            }
            all &= any;
        }
        keep.push(all);
    }
    if require_keys && !profile.sample.is_empty() {
        if let Some(f) = filters.iter().find(|f| !keys.contains(f.key.as_str())) {
            return Err(unknown_label(&f.key, keys));
        }
    }
    let mut keep = keep.into_iter();
    profile.sample.retain(|_| keep.next().unwrap_or(false));
    Ok(())
}

/// What [`StackProfile::keep_labels`] kept: the filters, and each value's total before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filtered {
    pub labels: Vec<LabelFilter>,
    /// Per value type, the sum over every sample before any was left out.
    pub totals: Vec<i64>,
}

impl StackProfile {
    /// Keeps the samples that match every filter of `filters`, for the views that follow; a
    /// key that no sample has is [`ViewError::UnknownLabel`] (see the module doc). Nothing
    /// happens without filters.
    pub fn keep_labels(&mut self, filters: &[LabelFilter]) -> Result<(), ViewError> {
        if filters.is_empty() {
            return Ok(());
        }
        for f in filters {
            self.require_label(&f.key)?;
        }
        let totals = (0..self.value_types.len()).map(|i| self.total(i)).collect();
        self.samples.retain(|s| {
            filters.iter().all(|f| s.labels.iter().any(|(k, v)| *k == f.key && f.matches(v)))
        });
        match &mut self.filtered {
            // Filtered twice: all of them apply, and the totals are the first's "before".
            Some(filtered) => filtered.labels.extend_from_slice(filters),
            None => self.filtered = Some(Filtered { labels: filters.to_vec(), totals }),
        }
        Ok(())
    }

    /// The error of a view that has nothing to show: [`ViewError::NoMatch`] if
    /// [`Self::keep_labels`] left no sample, else `otherwise`.
    pub(crate) fn nothing_left(&self, otherwise: ViewError) -> ViewError {
        match &self.filtered {
            Some(f) if self.samples.is_empty() => {
                ViewError::NoMatch { labels: describe(&f.labels) }
            }
            _ => otherwise,
        }
    }
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

    #[test]
    fn a_text_filter_matches_a_string_or_the_decimal_form_of_a_number() {
        let bytes = profile(&[("a", 1, "7 (1)", 10), ("b", 2, "8 (2)", 10), ("c", 4, "7 (1)", 11)])
            .encode_to_vec();
        let keep = |filters: &[LabelFilter]| {
            let mut p = decode(&bytes, &ReadLimits::default()).unwrap();
            filter_matching(&mut p, filters).map(|()| folded(&p))
        };
        assert_eq!(keep(&[LabelFilter::text("process id", "10")]).unwrap(), "a 1\nb 2\n");
        assert_eq!(keep(&[LabelFilter::text("process id", "010")]).unwrap(), "");
        let both = [LabelFilter::text("thread id", "7 (1)"), LabelFilter::text("process id", "11")];
        assert_eq!(keep(&both).unwrap(), "c 4\n");
        assert_eq!(keep(&[LabelFilter::text("thread id", "9 (3)")]).unwrap(), "");
        // A key no sample has: an error naming the keys there are.
        let e = keep(&[LabelFilter::text("trace endpoint", "GET /")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "no sample has a label \"trace endpoint\"; this profile's labels: process id, thread id"
        );
        // The typed filter keeps its contract: a missing key keeps nothing, no error.
        let mut p = decode(&bytes, &ReadLimits::default()).unwrap();
        filter(&mut p, &[("span".to_string(), ResolvedLabelValue::Num(1))]).unwrap();
        assert!(p.sample.is_empty());
    }

    #[test]
    fn keep_labels_leaves_the_views_the_matching_samples_and_says_what_it_kept() {
        let bytes = profile(&[("a", 1, "7 (1)", 10), ("b", 2, "8 (2)", 10), ("c", 4, "7 (1)", 11)])
            .encode_to_vec();
        let read = || StackProfile::from_bytes(&bytes, &ReadLimits::default()).unwrap();
        let mut p = read();
        p.keep_labels(&[LabelFilter::text("thread id", "7 (1)")]).unwrap();
        assert_eq!(p.folded(0, &FoldOptions::default()).unwrap(), "a 1\nc 4\n");
        assert_eq!(p.total(0), 5);
        let filtered = p.filtered.clone().unwrap();
        assert_eq!(filtered.totals, [7]);
        assert_eq!(describe(&filtered.labels), "thread id=7 (1)");
        // Again: both apply, the totals stay those of the whole profile.
        p.keep_labels(&[LabelFilter::text("process id", "11")]).unwrap();
        assert_eq!(p.folded(0, &FoldOptions::default()).unwrap(), "c 4\n");
        assert_eq!(p.filtered.as_ref().unwrap().totals, [7]);

        let mut none = read();
        none.keep_labels(&[LabelFilter::text("process id", "12")]).unwrap();
        assert!(none.samples.is_empty());
        assert_eq!(none.folded(0, &FoldOptions::default()).unwrap(), "");
        let e = none.flamegraph(0, None, &FoldOptions::default()).unwrap_err();
        assert_eq!(e.to_string(), "nothing to draw: no sample has process id=12");
        let options = crate::views::speedscope::SpeedscopeOptions::default();
        assert!(matches!(none.speedscope(&[0], &options), Err(ViewError::NoMatch { .. })));

        let mut typo = read();
        let e = typo.keep_labels(&[LabelFilter::text("thread", "7 (1)")]).unwrap_err();
        assert!(matches!(e, ViewError::UnknownLabel { .. }), "{e}");
        assert_eq!(typo.samples.len(), 3, "an error keeps nothing out");
        assert!(read().keep_labels(&[]).is_ok());
    }
}
