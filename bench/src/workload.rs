//! The shared workload (`bench/gen_workload.rb`), read fully before anything is timed, and the
//! one way every benchmarked recorder is fed from it: each sample is built from borrowed
//! strings, as a binding builds it from Ruby strings.
use std::collections::HashMap;
use std::path::Path;

use ddprof_recorder_core::{Frame, Label, LabelValue, Sample, ValueType};
use serde::Deserialize;

/// One label as the JSON has it: `[key, string_or_nil, integer_or_nil]`.
type RawLabel<'a> = (&'a str, Option<&'a str>, Option<i64>);

#[derive(Deserialize)]
struct RawWorkload<'a> {
    value_types: Vec<(String, String)>,
    frames: Vec<(String, String, i64)>,
    stacks: Vec<Vec<u32>>,
    #[serde(borrow)]
    samples: Vec<(u32, Vec<i64>, Vec<RawLabel<'a>>)>,
    endpoints: Vec<(i64, String)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WValue {
    /// Index into [`Workload::strings`].
    Str(u32),
    Num(i64),
}

#[derive(Debug, Clone, Copy)]
pub struct WLabel {
    /// Index into [`Workload::strings`].
    pub key: u32,
    pub value: WValue,
}

#[derive(Debug, Clone, Copy)]
pub struct WSample {
    pub stack: u32,
    /// Range in [`Workload::labels`].
    pub labels: (u32, u32),
}

/// A workload in memory, compact enough that the large one (2M samples) fits comfortably.
pub struct Workload {
    /// File stem: `small`, `medium`, `large` for generated workloads.
    pub name: String,
    pub value_types: Vec<ValueType>,
    /// `(function name, filename, line)`.
    pub frames: Vec<(String, String, i64)>,
    /// Frame indices, leaf first.
    pub stacks: Vec<Vec<u32>>,
    /// Label keys and string label values, each once.
    pub strings: Vec<String>,
    pub samples: Vec<WSample>,
    /// `value_types.len()` values per sample.
    pub values: Vec<i64>,
    pub labels: Vec<WLabel>,
    /// `(local root span id, endpoint)`.
    pub endpoints: Vec<(i64, String)>,
}

impl Workload {
    pub fn load(path: &Path) -> Result<Self, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let raw: RawWorkload<'_> = serde_json::from_slice(&bytes)
            .map_err(|e| format!("{}: not a gen_workload.rb workload: {e}", path.display()))?;
        let n = raw.value_types.len();
        let mut index = HashMap::<&str, u32>::new();
        let mut strings = Vec::new();
        let mut intern = |s| intern(&mut index, &mut strings, s);
        let mut samples = Vec::with_capacity(raw.samples.len());
        let mut values = Vec::with_capacity(raw.samples.len() * n);
        let mut labels = Vec::new();
        for (i, (stack, vals, raw_labels)) in raw.samples.iter().enumerate() {
            if *stack as usize >= raw.stacks.len() || vals.len() != n {
                return Err(format!("{}: sample {i} is malformed", path.display()));
            }
            let start = labels.len() as u32;
            for &(key, s, num) in raw_labels {
                let value = match s {
                    Some(s) => WValue::Str(intern(s)),
                    None => WValue::Num(num.unwrap_or(0)),
                };
                labels.push(WLabel { key: intern(key), value });
            }
            samples.push(WSample { stack: *stack, labels: (start, labels.len() as u32) });
            values.extend_from_slice(vals);
        }
        if raw.stacks.iter().flatten().any(|&f| f as usize >= raw.frames.len()) {
            return Err(format!("{}: a stack names a frame that does not exist", path.display()));
        }
        Ok(Self {
            name: path.file_stem().map_or_else(String::new, |s| s.to_string_lossy().into_owned()),
            value_types: raw.value_types.into_iter().map(|(t, u)| ValueType::new(t, u)).collect(),
            frames: raw.frames,
            stacks: raw.stacks,
            strings,
            samples,
            values,
            labels,
            endpoints: raw.endpoints,
        })
    }

    pub fn num_values(&self) -> usize {
        self.value_types.len()
    }

    /// Sum of each value type over all samples: what a correct profile must total.
    pub fn totals(&self) -> Vec<i64> {
        let n = self.num_values();
        let mut totals = vec![0i64; n];
        for chunk in self.values.chunks_exact(n) {
            for (t, v) in totals.iter_mut().zip(chunk) {
                *t += v;
            }
        }
        totals
    }

    /// Distinct stacks the samples use (what the scaling plot puts on its x axis).
    pub fn distinct_stacks(&self) -> usize {
        let mut used = vec![false; self.stacks.len()];
        for s in &self.samples {
            used[s.stack as usize] = true;
        }
        used.iter().filter(|&&u| u).count()
    }

    /// Mean frames per sample.
    pub fn mean_frames(&self) -> f64 {
        let frames: usize = self.samples.iter().map(|s| self.stacks[s.stack as usize].len()).sum();
        frames as f64 / self.samples.len().max(1) as f64
    }

    /// Feeds samples `range` (indices taken modulo the sample count) to `record`, each built
    /// from borrowed strings into reused buffers, as a binding does for every call.
    #[inline]
    pub fn feed(&self, range: std::ops::Range<usize>, mut record: impl FnMut(&Sample<'_>)) {
        let mut frames: Vec<Frame<'_>> = Vec::with_capacity(128);
        let mut labels: Vec<Label<'_>> = Vec::with_capacity(8);
        let n = self.num_values();
        for i in range {
            let i = i % self.samples.len();
            let sample = self.samples[i];
            frames.clear();
            frames.extend(self.stacks[sample.stack as usize].iter().map(|&f| {
                let (name, file, line) = &self.frames[f as usize];
                Frame { function_name: name, filename: file, line: *line }
            }));
            labels.clear();
            labels.extend(
                self.labels[sample.labels.0 as usize..sample.labels.1 as usize].iter().map(|l| {
                    Label {
                        key: &self.strings[l.key as usize],
                        value: match l.value {
                            WValue::Str(s) => LabelValue::Str(&self.strings[s as usize]),
                            WValue::Num(v) => LabelValue::Num(v),
                        },
                    }
                }),
            );
            record(&Sample {
                frames: &frames,
                omitted_frames: 0,
                values: &self.values[i * n..(i + 1) * n],
                labels: &labels,
            });
        }
    }
}

fn intern<'a>(index: &mut HashMap<&'a str, u32>, strings: &mut Vec<String>, s: &'a str) -> u32 {
    *index.entry(s).or_insert_with(|| {
        strings.push(s.to_owned());
        strings.len() as u32 - 1
    })
}
