//! Functions and locations: each stored once, a location found from its frame in one probe.
use super::Profile;
use crate::hash::{bytes_eq, fx_hash, hash_frame as hash_frame_bytes};
use crate::strings::StringId;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Function {
    pub name: StringId,
    pub filename: StringId,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Location {
    /// Index into `Profile::functions`.
    pub function: u32,
    pub line: i64,
}

/// A `location_index` entry: the frame a location was made from, as byte ranges of its
/// strings in the string table's buffer. A lookup compares the caller's strings with those
/// bytes directly; going through the location, its function and two string ids instead cost
/// three more dependent loads per frame.
#[derive(Debug, Clone, Copy)]
pub(super) struct FrameEntry {
    name: (usize, usize),
    filename: (usize, usize),
    line: i64,
    location: u32,
}

#[inline]
pub(super) fn hash_frame(function_name: &str, filename: &str, line: i64) -> u64 {
    hash_frame_bytes(function_name.as_bytes(), filename.as_bytes(), line)
}

fn hash_function(function: Function) -> u64 {
    fx_hash(&(function.name, function.filename))
}

impl Profile {
    /// The location of a frame: one probe that compares the caller's strings with the stored
    /// bytes. Small enough to inline into the per-frame loop; adding a new frame is out of line.
    #[inline]
    pub(super) fn intern_frame(&mut self, function_name: &str, filename: &str, line: i64) -> u32 {
        let hash = hash_frame(function_name, filename, line);
        let bytes = self.strings.bytes();
        let found = self.location_index.find(hash, |e| {
            e.line == line
                && bytes_eq(&bytes[e.name.0..e.name.1], function_name.as_bytes())
                && bytes_eq(&bytes[e.filename.0..e.filename.1], filename.as_bytes())
        });
        match found {
            Some(e) => e.location,
            None => self.add_frame(hash, function_name, filename, line),
        }
    }

    /// [`Profile::intern_frame`]'s lookup alone, for the exact limit check and the placeholder.
    /// Written twice on purpose: with one `#[inline(always)]` lookup shared by both, the hot
    /// loop compiled worse (callgrind, `bench/run core small --only core-add`: 256.9M
    /// instructions as is, 281.3M shared; 2026-11-30).
    pub(super) fn find_frame(&self, function_name: &str, filename: &str, line: i64) -> Option<u32> {
        let hash = hash_frame(function_name, filename, line);
        let bytes = self.strings.bytes();
        self.location_index
            .find(hash, |e| {
                e.line == line
                    && bytes_eq(&bytes[e.name.0..e.name.1], function_name.as_bytes())
                    && bytes_eq(&bytes[e.filename.0..e.filename.1], filename.as_bytes())
            })
            .map(|e| e.location)
    }

    #[cold]
    #[inline(never)]
    pub(super) fn add_frame(
        &mut self,
        hash: u64,
        function_name: &str,
        filename: &str,
        line: i64,
    ) -> u32 {
        let function = self.intern_function(function_name, filename);
        let location = self.locations.len() as u32;
        self.locations.push(Location { function, line });
        let Function { name, filename } = self.functions[function as usize];
        let entry = FrameEntry {
            name: self.strings.span(name),
            filename: self.strings.span(filename),
            line,
            location,
        };
        let bytes = self.strings.bytes();
        self.location_index.insert_unique(hash, entry, |e| {
            hash_frame_bytes(&bytes[e.name.0..e.name.1], &bytes[e.filename.0..e.filename.1], e.line)
        });
        location
    }

    fn intern_function(&mut self, name: &str, filename: &str) -> u32 {
        let function =
            Function { name: self.strings.intern(name), filename: self.strings.intern(filename) };
        let hash = hash_function(function);
        let functions = &self.functions;
        if let Some(&id) = self.function_index.find(hash, |&id| functions[id as usize] == function)
        {
            return id;
        }
        let id = self.functions.len() as u32;
        self.functions.push(function);
        let functions = &self.functions;
        self.function_index.insert_unique(hash, id, |&id| hash_function(functions[id as usize]));
        id
    }
}
