//! Handing freed heap memory back to the OS once the server goes idle.
//!
//! Under load, glibc's allocator spreads the engine's, MLX's and the HTTP threads' allocations
//! over per-thread arenas; after a burst their free pages stay mapped, so RSS ratchets up
//! storm after storm although nothing leaks (measured: +35% over five storms of 300 streams,
//! flat with one arena). `malloc_trim(0)` returns the free pages of every arena; it runs on a
//! blocking thread, at most every [`CHECK_EVERY`], and only when no generation is in flight
//! and some finished since the last trim. Other allocators (macOS) return memory themselves.

use std::sync::atomic::Ordering;
use std::sync::Weak;
use std::time::Duration;

use super::state::AppState;

const CHECK_EVERY: Duration = Duration::from_secs(1);

/// Runs while the server state lives (a weak reference: it never keeps the engine alive).
pub async fn trim_when_idle(state: Weak<AppState>) {
    let mut trimmed_at = u64::MAX;
    loop {
        tokio::time::sleep(CHECK_EVERY).await;
        let Some(state) = state.upgrade() else { return };
        let finished = state.metrics.finished_total();
        let in_flight = state.metrics.in_flight.load(Ordering::Relaxed);
        drop(state);
        if finished == trimmed_at || in_flight != 0 {
            continue;
        }
        trimmed_at = finished;
        let _ = tokio::task::spawn_blocking(release_free_memory).await;
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn release_free_memory() {
    // SAFETY: malloc_trim only walks the allocator's own structures, under its locks.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn release_free_memory() {}
