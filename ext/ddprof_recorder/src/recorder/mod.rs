//! The recorder's binding: `DdprofRecorder::StackRecorder` (a TypedData object around the
//! core's two-slot recorder) and its `Testing` hooks, the conversion of Ruby arguments into the
//! core's sample types, running work without the GVL, how every `_native_*` entry point turns
//! errors and panics into Ruby exceptions, and fork detection. Every other folder's entry
//! points run through [`errors`], and its per-process state checks [`fork`].

pub mod convert;
pub mod errors;
pub mod fork;
pub mod nogvl;
pub mod stack_recorder;
pub mod testing;
