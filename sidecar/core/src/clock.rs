//! The two clocks the core reads, as Python reads them: the wall clock that a stored
//! answer's Age counts on, and the monotonic one of the loop's timers.

use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds since the epoch, as Python's `time.time()`.
pub fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Seconds on the clock of Python's `time.monotonic()` (CLOCK_MONOTONIC).
pub fn monotonic() -> f64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a plain clock read into a local.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as f64 + now.tv_nsec as f64 / 1e9
}
