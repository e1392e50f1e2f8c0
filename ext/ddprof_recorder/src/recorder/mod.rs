//! The recorder's binding: `DdprofRecorder::StackRecorder` (a TypedData object around the
//! core's two-slot recorder), the conversion of Ruby arguments into the core's sample types,
//! running work without the GVL, and how every `_native_*` entry point turns errors and
//! panics into Ruby exceptions. Every other folder's entry points run through [`errors`].

pub mod convert;
pub mod errors;
pub mod nogvl;
pub mod stack_recorder;
