//! Memory profiling: [`allocations`] samples allocations from a NEWOBJ hook, [`duty_cycle`]
//! keeps that hook's cost under a target, [`heap`] keeps the sampled objects that are still
//! alive, and [`gc_events`] measures the time each thread spends in the GC. All of them hook
//! Ruby's internal events through [`internal_hook`].

pub mod allocations;
pub mod duty_cycle;
pub mod gc_events;
pub mod heap;
pub mod internal_hook;
