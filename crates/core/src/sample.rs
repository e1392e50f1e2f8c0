//! The borrowed input types: what a caller hands to [`crate::Recorder::record_sample`].
//! Nothing here owns a string, so a binding can build a sample without allocating.

/// A sample type and its unit, e.g. `("cpu-time", "nanoseconds")`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueType {
    pub r#type: String,
    pub unit: String,
}

impl ValueType {
    pub fn new(r#type: impl Into<String>, unit: impl Into<String>) -> Self {
        Self { r#type: r#type.into(), unit: unit.into() }
    }
}

/// One stack frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    pub function_name: &'a str,
    pub filename: &'a str,
    pub line: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabelValue<'a> {
    Str(&'a str),
    Num(i64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Label<'a> {
    pub key: &'a str,
    pub value: LabelValue<'a>,
}

/// One observation: a stack (leaf first), one value per value type, and labels.
#[derive(Debug, Clone, Copy)]
pub struct Sample<'a> {
    pub frames: &'a [Frame<'a>],
    /// Frames the caller already cut off the root side of `frames` (they count towards the
    /// `"N frames omitted"` placeholder). Lets a binding skip converting frames it would drop.
    pub omitted_frames: usize,
    pub values: &'a [i64],
    pub labels: &'a [Label<'a>],
}

/// A local root span id, as given to `record_endpoint` or found in the
/// `"local root span id"` label. An integer and the string of its decimal digits are the
/// same id, so strings are canonicalized with [`SpanId::from_str`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SpanId<'a> {
    Num(i64),
    Str(&'a str),
}

impl<'a> SpanId<'a> {
    /// The canonical id for a string: [`SpanId::Num`] when `s` is exactly the decimal form of
    /// an i64 (no sign but `-`, no leading zeros), else [`SpanId::Str`].
    #[allow(clippy::should_implement_trait)] // borrows `s`; FromStr cannot
    pub fn from_str(s: &'a str) -> Self {
        let digits = s.strip_prefix('-').unwrap_or(s);
        let canonical = !digits.is_empty()
            && digits.bytes().all(|b| b.is_ascii_digit())
            && (digits == "0" || !digits.starts_with('0'))
            && s != "-0";
        match s.parse::<i64>() {
            Ok(n) if canonical => Self::Num(n),
            _ => Self::Str(s),
        }
    }

    /// The same id in canonical form: a [`SpanId::Str`] goes through [`SpanId::from_str`].
    pub fn canonical(self) -> Self {
        match self {
            Self::Str(s) => Self::from_str(s),
            num => num,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn span_ids_canonicalize_decimal_strings() {
        assert_eq!(SpanId::from_str("123"), SpanId::Num(123));
        assert_eq!(SpanId::from_str("-5"), SpanId::Num(-5));
        assert_eq!(SpanId::from_str("0"), SpanId::Num(0));
        assert_eq!(SpanId::from_str("0123"), SpanId::Str("0123"));
        assert_eq!(SpanId::from_str("+1"), SpanId::Str("+1"));
        assert_eq!(SpanId::from_str("-0"), SpanId::Str("-0"));
        assert_eq!(SpanId::from_str(""), SpanId::Str(""));
        assert_eq!(SpanId::from_str("abc"), SpanId::Str("abc"));
        // Beyond i64 (a u64 span id): stays a string, equal to the same digits as a string.
        assert_eq!(SpanId::from_str("18446744073709551615"), SpanId::Str("18446744073709551615"));
    }
}
