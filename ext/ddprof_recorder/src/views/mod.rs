//! Views of pprof profiles for the CLI and `DdprofRecorder`'s module functions (folded
//! stacks, flamegraph, speedscope, top, timeline, merge, filter): thin wrappers around the
//! core's `views`, run without the GVL.

pub mod pprof_views;
