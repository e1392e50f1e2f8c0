//! Endpoints: the `"trace endpoint"` label of the samples whose `"local root span id"` label
//! names a span that [`Profile::record_endpoint`] linked to an endpoint.
use super::labels::StoredValue;
use super::Profile;
use crate::sample::SpanId;
use crate::strings::StringId;
use crate::{LOCAL_ROOT_SPAN_ID_LABEL, TRACE_ENDPOINT_LABEL};

/// A span id as an endpoint key: numbers by value, other strings by their interned id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum SpanKey {
    Num(i64),
    Str(StringId),
}

impl Profile {
    /// Links samples whose `"local root span id"` label is `span` to `endpoint`; the latest
    /// call for a span wins. Returns false, storing nothing, when that needs more strings than
    /// `max_strings` or more endpoints than `max_label_sets` (see [`Limits`]).
    pub fn record_endpoint(&mut self, span: SpanId<'_>, endpoint: &str) -> bool {
        let limits = &self.limits;
        let surely_fits = self.strings.len() + 2 <= limits.max_strings
            && self.endpoints.len() < limits.max_label_sets;
        if !surely_fits && !self.endpoint_fits(span, endpoint) {
            return false;
        }
        let key = match span.canonical() {
            SpanId::Num(n) => SpanKey::Num(n),
            SpanId::Str(s) => SpanKey::Str(self.strings.intern(s)),
        };
        let endpoint = self.strings.intern(endpoint);
        self.endpoints.insert(key, endpoint);
        true
    }

    #[cold]
    fn endpoint_fits(&self, span: SpanId<'_>, endpoint: &str) -> bool {
        // A span string not interned yet cannot be a key yet.
        let (key, span_str) = match span.canonical() {
            SpanId::Num(n) => (Some(SpanKey::Num(n)), None),
            SpanId::Str(s) => (self.strings.lookup(s).map(SpanKey::Str), Some(s)),
        };
        let new_key = key.is_none_or(|key| !self.endpoints.contains_key(&key));
        let mut new_strings = usize::from(self.strings.lookup(endpoint).is_none());
        if let Some(s) = span_str {
            new_strings += usize::from(self.strings.lookup(s).is_none() && s != endpoint);
        }
        (new_strings == 0 || self.strings.len() + new_strings <= self.limits.max_strings)
            && (!new_key || self.endpoints.len() < self.limits.max_label_sets)
    }

    /// The endpoint of each label set, by label set id, and the string id of the
    /// `"trace endpoint"` key (None when no label set has an endpoint). Interns the key.
    pub(crate) fn resolve_endpoints(&mut self) -> (Vec<Option<StringId>>, Option<StringId>) {
        let span_key = match self.strings.lookup(LOCAL_ROOT_SPAN_ID_LABEL) {
            Some(id) if !self.endpoints.is_empty() => id,
            _ => return (Vec::new(), None),
        };
        let resolved: Vec<Option<StringId>> = (0..self.label_sets.len() as u32)
            .map(|set| {
                let label = self
                    .label_set(set)
                    .iter()
                    .map(|&l| self.labels[l as usize])
                    .find(|l| l.key == span_key)?;
                let key = match label.value {
                    StoredValue::Num(n) => SpanKey::Num(n),
                    StoredValue::Str(id) => match SpanId::from_str(self.strings.get(id)) {
                        SpanId::Num(n) => SpanKey::Num(n),
                        SpanId::Str(_) => SpanKey::Str(id),
                    },
                };
                self.endpoints.get(&key).copied()
            })
            .collect();
        if resolved.iter().all(Option::is_none) {
            return (Vec::new(), None);
        }
        (resolved, Some(self.strings.intern(TRACE_ENDPOINT_LABEL)))
    }
}
