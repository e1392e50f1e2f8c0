//! Memory profiling: [`allocations`] samples allocations from a NEWOBJ hook and records them
//! from a postponed job, the samples waiting for it in [`pending`]; [`duty_cycle`] keeps that
//! hook's cost under a target, measured by [`hook_cost`]; [`heap`] keeps the sampled objects
//! that are still alive, and [`gc_events`] measures the time each thread spends in the GC. All
//! of them hook Ruby's internal events through `vm::internal_hook`; the state their hooks and GC
//! callbacks share lives in `vm::gvl_cell`'s cells.

pub mod allocations;
pub mod duty_cycle;
pub mod gc_events;
pub mod heap;
pub mod hook_cost;
pub mod pending;

use magnus::{Error, Ruby};

/// Registers the folder's GC roots, postponed jobs and end procs (its native methods on
/// `Profiler` are `ruby_api::profiler`'s). At load.
pub fn init(ruby: &Ruby) -> Result<(), Error> {
    allocations::init(ruby)?;
    heap::init(ruby)?;
    gc_events::init();
    Ok(())
}
