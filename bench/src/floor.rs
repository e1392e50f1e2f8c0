//! The floor: the least a recorder must do to aggregate samples, written plainly with FxHash
//! maps. It interns strings, frames, stacks and label sets, and sums values per
//! (stack, label set); no locks, no validation, no truncation, no pprof. The core's add path
//! is compared with it in the same run (`ratio_to_floor`).
use ddprof_recorder_core::{LabelValue, Sample};
use rustc_hash::FxHashMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum FloorValue {
    Str(u32),
    Num(i64),
}

#[derive(Default)]
pub struct FloorRecorder {
    num_values: usize,
    strings: FxHashMap<Box<str>, u32>,
    frames: FxHashMap<(u32, u32, i64), u32>,
    stacks: FxHashMap<Box<[u32]>, u32>,
    label_sets: FxHashMap<Box<[(u32, FloorValue)]>, u32>,
    samples: FxHashMap<(u32, u32), u32>,
    values: Vec<i64>,
    scratch_stack: Vec<u32>,
    scratch_labels: Vec<(u32, FloorValue)>,
}

impl FloorRecorder {
    pub fn new(num_values: usize) -> Self {
        Self { num_values, ..Self::default() }
    }

    fn intern(strings: &mut FxHashMap<Box<str>, u32>, s: &str) -> u32 {
        if let Some(&id) = strings.get(s) {
            return id;
        }
        let id = strings.len() as u32;
        strings.insert(s.into(), id);
        id
    }

    pub fn add(&mut self, sample: &Sample<'_>) {
        let mut stack = std::mem::take(&mut self.scratch_stack);
        stack.clear();
        for f in sample.frames {
            let name = Self::intern(&mut self.strings, f.function_name);
            let file = Self::intern(&mut self.strings, f.filename);
            let next = self.frames.len() as u32;
            stack.push(*self.frames.entry((name, file, f.line)).or_insert(next));
        }
        let stack_id = match self.stacks.get(&stack[..]) {
            Some(&id) => id,
            None => {
                let id = self.stacks.len() as u32;
                self.stacks.insert(stack[..].into(), id);
                id
            }
        };
        self.scratch_stack = stack;

        let mut labels = std::mem::take(&mut self.scratch_labels);
        labels.clear();
        for l in sample.labels {
            let key = Self::intern(&mut self.strings, l.key);
            let value = match l.value {
                LabelValue::Str(s) => FloorValue::Str(Self::intern(&mut self.strings, s)),
                LabelValue::Num(n) => FloorValue::Num(n),
            };
            labels.push((key, value));
        }
        labels.sort_unstable();
        let labels_id = match self.label_sets.get(&labels[..]) {
            Some(&id) => id,
            None => {
                let id = self.label_sets.len() as u32;
                self.label_sets.insert(labels[..].into(), id);
                id
            }
        };
        self.scratch_labels = labels;

        let n = self.num_values;
        let next = self.samples.len() as u32;
        let index = *self.samples.entry((stack_id, labels_id)).or_insert(next) as usize;
        if index == self.values.len() / n {
            self.values.extend_from_slice(sample.values);
        } else {
            for (sum, v) in self.values[index * n..(index + 1) * n].iter_mut().zip(sample.values) {
                *sum += v;
            }
        }
    }

    /// Distinct (stack, label set) pairs.
    pub fn samples_out(&self) -> usize {
        self.samples.len()
    }

    pub fn totals(&self) -> Vec<i64> {
        let mut totals = vec![0; self.num_values];
        for chunk in self.values.chunks_exact(self.num_values) {
            for (t, v) in totals.iter_mut().zip(chunk) {
                *t += v;
            }
        }
        totals
    }
}
