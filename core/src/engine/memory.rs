//! Keeping the engine's memory bounded: MLX's limits, and when its buffer cache (freed
//! buffers MLX keeps for reuse) and the C heap's free pages go back to the system.

use crate::{Error, Result};

/// [`super::EngineConfig::prompt_cache_bytes`]'s default: size the prompt cache from the memory
/// the device has left once the model is loaded ([`prompt_cache_capacity`]).
pub const PROMPT_CACHE_AUTO: u64 = u64::MAX;

/// The prompt cache's capacity under `config`, and the ceiling it shares with the rows' KV
/// (cached entries give way to rows above it). The capacity is the setting, or for
/// [`PROMPT_CACHE_AUTO`] a quarter of what MLX may still allocate (its memory limit less what
/// it holds: the weights), within the KV budget. The ceiling is the KV budget, else for
/// `auto` all MLX may still allocate, else none (an explicit size is the cache's own).
pub fn prompt_cache_capacity(config: &super::EngineConfig) -> (u64, Option<u64>) {
    if config.prompt_cache_bytes != PROMPT_CACHE_AUTO {
        return (config.prompt_cache_bytes, config.kv_budget_bytes);
    }
    let limit = mlx_rs::memory::memory_limit().unwrap_or(0) as u64;
    let active = mlx_rs::memory::active_memory().unwrap_or(0) as u64;
    let free = limit.saturating_sub(active);
    match config.kv_budget_bytes {
        Some(b) => ((free / 4).min(b), Some(b)),
        None => (free / 4, Some(free)),
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryPolicy {
    /// Largest buffer cache MLX keeps (`mlx.set_cache_limit`); `None` leaves MLX's default.
    pub cache_limit_bytes: Option<usize>,
    /// Return the buffer cache every this many decode steps (0 = only when idle). mlx-lm's
    /// server and the product this grows from clear it every 256 steps.
    pub clear_cache_every_steps: u64,
    /// MLX's memory limit (`mlx.set_memory_limit`): allocations beyond it wait for buffers in
    /// flight to be freed, then fail. `None` leaves MLX's default.
    pub memory_limit_bytes: Option<usize>,
    /// Memory MLX may keep wired (resident) on Apple GPUs (`mlx.set_wired_limit`); ignored
    /// elsewhere. `None` leaves MLX's default.
    pub wired_limit_bytes: Option<usize>,
}

impl Default for MemoryPolicy {
    fn default() -> Self {
        MemoryPolicy { cache_limit_bytes: None, clear_cache_every_steps: 256, memory_limit_bytes: None, wired_limit_bytes: None }
    }
}

impl MemoryPolicy {
    pub fn validate(&self) -> Result<()> {
        if self.memory_limit_bytes == Some(0) {
            return Err(Error::InvalidRequest("memory_limit_bytes must be positive when set".into()));
        }
        Ok(())
    }

    /// Sets MLX's process-wide limits (the last engine started sets them).
    pub fn apply(&self) -> Result<()> {
        if let Some(limit) = self.cache_limit_bytes {
            mlx_rs::memory::set_cache_limit(limit)?;
        }
        if let Some(limit) = self.memory_limit_bytes {
            mlx_rs::memory::set_memory_limit(limit)?;
        }
        if let Some(limit) = self.wired_limit_bytes {
            if cfg!(target_os = "macos") {
                mlx_rs::memory::set_wired_limit(limit)?;
            }
        }
        Ok(())
    }

    /// Whether the cache is due after decode step `step`.
    pub(crate) fn due(&self, step: u64) -> bool {
        self.clear_cache_every_steps > 0 && step > 0 && step % self.clear_cache_every_steps == 0
    }
}

/// Gives MLX's buffer cache back, and (glibc) the heap's free pages, so an idle engine's RSS
/// returns to what it holds.
pub(crate) fn release_cached_memory() {
    let _ = mlx_rs::memory::clear_cache();
    release_free_heap();
}

/// Makes the C heap returnable, for a long-running process (`weft serve`): glibc gives each
/// busy thread an arena of its own, and an arena's top chunk goes back to the system neither
/// by `malloc_trim` (it trims only the main arena's top) nor on free once glibc has raised
/// its trim threshold after a large free (to tens of MB): an idle server kept 20-30 MB of
/// freed buffers resident after some storms and not others. One arena (the main one) makes
/// every free page trimmable; the soak (tests/server/test_soak.py) measured no slowdown with
/// the server's handful of threads. A no-op elsewhere.
pub fn use_single_heap_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator tuning parameter.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Returns the C heap's free pages to the system (glibc's `malloc_trim`; a no-op elsewhere).
/// A host whose own threads free memory after the engine went idle (an HTTP server's
/// connection buffers) calls this once it is idle too.
pub fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free heap pages to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// What MLX holds now: (active bytes, buffer-cache bytes).
pub fn mlx_memory() -> (u64, u64) {
    let active = mlx_rs::memory::active_memory().unwrap_or(0) as u64;
    let cache = mlx_rs::memory::cache_memory().unwrap_or(0) as u64;
    (active, cache)
}
