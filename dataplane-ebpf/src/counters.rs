//! Exit counters: every exit of a program is counted once in `STATS`, by reason.

use crate::maps::STATS;

/// A verdict and the `stat` slot that explains it.
pub type Exit = (i32, u32);

/// Counts one exit.
#[inline(always)]
pub fn count(reason: u32) {
    if let Some(p) = STATS.get_ptr_mut(reason) {
        // SAFETY: a per-CPU slot; only this CPU writes it while the program runs.
        unsafe { *p += 1 };
    }
}
