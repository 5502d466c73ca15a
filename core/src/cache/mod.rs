//! KV caches behind one trait. A cache supplies what attention needs for a step: the RoPE
//! offset (a scalar for one sequence, a per-row array for a left-padded batch), the attention
//! mask, and storage for the step's keys and values.

mod kv;

pub use kv::KvCacheSingle;

use mlx_rs::Array;

use crate::Result;

/// Position of the first new token, for RoPE.
#[derive(Debug, Clone)]
pub enum RopeOffset {
    Scalar(i32),
    /// `[B]` int32: each row's own position (left-padded rows start negative).
    PerRow(Array),
}

/// What the fused attention kernel masks with.
#[derive(Debug, Clone)]
pub enum AttentionMask {
    /// A single query position sees every cached key.
    None,
    /// Square causal mask handled inside the kernel.
    Causal,
    /// Explicit boolean mask broadcastable to `[B, 1, L, S]` (true = attend).
    Array(Array),
}

pub trait KvCache: Send {
    /// RoPE offset for the next `update_and_fetch`.
    fn rope_offset(&self) -> RopeOffset;
    /// Stores `[B, kv_heads, L, D]` keys/values; returns all cached keys/values including them.
    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)>;
    /// The mask for `n` new query positions (call before `update_and_fetch`).
    fn make_mask(&self, n: i32, window: Option<i32>) -> Result<AttentionMask>;
    /// Number of token positions cached.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Bytes held by the cache's arrays.
    fn nbytes(&self) -> usize;
    /// Arrays to evaluate so the cache is materialized (after a prefill chunk).
    fn state(&self) -> Vec<Array>;
}

/// mlx-lm's `create_causal_mask`: `mask[i, j] = j <= offset + i` (∧ `offset + i - j < window`).
pub fn causal_mask(n: i32, offset: i32, window: Option<i32>) -> Result<Array> {
    let rinds = Array::from_iter(0..offset + n, &[offset + n]);
    let linds = Array::from_iter(offset..offset + n, &[n]).reshape(&[n, 1])?;
    let rinds = rinds.reshape(&[1, offset + n])?;
    let mut mask = linds.ge(&rinds)?;
    if let Some(w) = window {
        mask = mask.logical_and(&linds.lt(&rinds.add(Array::from_int(w))?)?)?;
    }
    Ok(mask)
}
