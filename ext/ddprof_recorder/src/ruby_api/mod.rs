//! Where each Ruby class gets its native methods: one file a class, which names the functions
//! (they live next to what they do) with their Ruby names and arities. `Profiler`'s are in
//! [`profiler`]; `StackRecorder`'s (`recorder::stack_recorder`), `PprofViews`'
//! (`views::pprof_views`), `Labels`' (`labels`) and `DirectoryExporter`'s
//! (`directory_exporter`) each come from a single file already.

pub mod profiler;
