//! Labels and label sets: each distinct (key, value) stored once, a set as sorted label ids.
use super::Profile;
use crate::hash::{fx_hash, hash_u32s};
use crate::sample::{Label, LabelValue};
use crate::strings::StringId;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum StoredValue {
    Str(StringId),
    Num(i64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct StoredLabel {
    pub key: StringId,
    pub value: StoredValue,
}

fn hash_label(label: &StoredLabel) -> u64 {
    fx_hash(label)
}

impl Profile {
    pub(super) fn intern_labels(&mut self, labels: &[Label<'_>]) -> u32 {
        let mut ids = std::mem::take(&mut self.scratch_labels);
        ids.clear();
        for label in labels.iter().filter(|l| !super::timed::is_end_timestamp(l)) {
            let value = match label.value {
                LabelValue::Str(s) => StoredValue::Str(self.strings.intern(s)),
                LabelValue::Num(n) => StoredValue::Num(n),
            };
            let label = StoredLabel { key: self.strings.intern(label.key), value };
            ids.push(self.intern_label(label));
        }
        // Keys are unique (validated), so a set of labels is a set of label ids: sorted, the
        // same pairs in any order are the same slice.
        ids.sort_unstable();
        let id = self.label_sets.intern(&ids, hash_u32s);
        self.scratch_labels = ids;
        id
    }

    fn intern_label(&mut self, label: StoredLabel) -> u32 {
        let hash = hash_label(&label);
        let labels = &self.labels;
        if let Some(&id) = self.label_index.find(hash, |&id| labels[id as usize] == label) {
            return id;
        }
        let id = self.labels.len() as u32;
        self.labels.push(label);
        let labels = &self.labels;
        self.label_index.insert_unique(hash, id, |&id| hash_label(&labels[id as usize]));
        id
    }

    pub(super) fn find_label(&self, label: StoredLabel) -> Option<u32> {
        let labels = &self.labels;
        self.label_index.find(hash_label(&label), |&id| labels[id as usize] == label).copied()
    }

    /// Label set `id` as ids into [`Profile::labels`].
    pub(crate) fn label_set(&self, id: u32) -> &[u32] {
        self.label_sets.get(id)
    }
}
