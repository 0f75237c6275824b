//! Counters: every exit of a program is counted once in `STATS`, by reason; what
//! clients send to a frontend and a backend in `FRONTEND_COUNTERS` and
//! `BACKEND_COUNTERS` (per CPU, so plain adds).

use crate::maps::{BACKEND_COUNTERS, FRONTEND_COUNTERS, STATS};

/// Whether the per-frontend and per-backend counters count (1) or not (0). Set by
/// the loader (`--no-flow-counters`, and the benchmark that measures what counting
/// costs); read-only data the verifier knows, so the branch not taken is dropped.
#[no_mangle]
static FLOW_COUNTERS: u8 = 1;

#[inline(always)]
fn flow_counters() -> bool {
    // SAFETY: a plain read of a static; volatile so the compiler keeps the read the
    // loader's value decides.
    unsafe { core::ptr::read_volatile(&FLOW_COUNTERS) != 0 }
}

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

/// Counts one packet from a client of frontend `frontend_id` sent to backend
/// `backend_id`, `bytes` long; `new` for the packet that gave the flow its backend.
#[inline(always)]
pub fn translated(frontend_id: u32, backend_id: u32, bytes: u64, new: bool) {
    if !flow_counters() {
        return;
    }
    let new = new as u64;
    if let Some(p) = FRONTEND_COUNTERS.get_ptr_mut(frontend_id) {
        // SAFETY: a per-CPU slot; only this CPU writes it while the program runs.
        unsafe {
            (*p).new += new;
            (*p).packets += 1;
            (*p).bytes += bytes;
        }
    }
    if let Some(p) = BACKEND_COUNTERS.get_ptr_mut(backend_id) {
        // SAFETY: as above.
        unsafe {
            (*p).new += new;
            (*p).packets += 1;
            (*p).bytes += bytes;
        }
    }
}

/// Counts a connection (or a datagram's flow) a socket of the node opened to
/// frontend `frontend_id` and was given backend `backend_id` for. Its packets do not
/// pass a translating program, so only the connection is counted.
#[inline(always)]
pub fn connected(frontend_id: u32, backend_id: u32) {
    if !flow_counters() {
        return;
    }
    if let Some(p) = FRONTEND_COUNTERS.get_ptr_mut(frontend_id) {
        // SAFETY: a per-CPU slot; only this CPU writes it while the program runs.
        unsafe { (*p).new += 1 };
    }
    if let Some(p) = BACKEND_COUNTERS.get_ptr_mut(backend_id) {
        // SAFETY: as above.
        unsafe { (*p).new += 1 };
    }
}

/// Counts a new flow to frontend `frontend_id` that found no backend: dropped, or
/// refused.
#[inline(always)]
pub fn refused(frontend_id: u32, dropped: bool) {
    if !flow_counters() {
        return;
    }
    if let Some(p) = FRONTEND_COUNTERS.get_ptr_mut(frontend_id) {
        // SAFETY: as in `translated`.
        unsafe {
            if dropped {
                (*p).drops += 1;
            } else {
                (*p).rejects += 1;
            }
        }
    }
}
