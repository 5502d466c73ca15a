//! KV caches behind one trait. A cache supplies what attention needs for a step: the RoPE
//! offset (a scalar for one sequence, a per-row array for a left-padded batch), the attention
//! mask, and storage for the step's keys and values. Linear-attention layers keep recurrent
//! state behind the same trait (`recurrent_state`), so the engine moves every layer's cache
//! the same way.

mod batch_kv;
mod batch_rotating;
mod kv;
mod quantized;
mod recurrent;
mod rotating;

pub use batch_kv::BatchKvCache;
pub use batch_rotating::BatchRotatingKvCache;
pub use kv::KvCacheSingle;
pub use quantized::{
    extend_rows_mixed, maybe_quantize, quantized_sdpa, BatchQuantizedKvCache, KvQuantization, QuantizedKvCache,
};
pub use recurrent::{BatchRecurrentCache, RecurrentCache, RecurrentState};
pub use rotating::RotatingKvCache;

use std::any::Any;

use mlx_rs::Array;

use crate::{Error, Result};

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

/// Fused scaled-dot-product attention over cached keys and values, with the cache-provided
/// mask (here, below `nn`, because the caches attend too).
pub fn sdpa(q: &Array, k: &Array, v: &Array, scale: f32, mask: &AttentionMask) -> Result<Array> {
    use mlx_rs::fast::{scaled_dot_product_attention, ScaledDotProductAttentionMask as M};
    Ok(match mask {
        AttentionMask::None => scaled_dot_product_attention(q, k, v, scale, None, None)?,
        AttentionMask::Causal => scaled_dot_product_attention(q, k, v, scale, M::Causal, None)?,
        AttentionMask::Array(m) => scaled_dot_product_attention(q, k, v, scale, M::Array(m), None)?,
    })
}

pub trait KvCache: Send {
    /// RoPE offset for the next `update_and_fetch`.
    fn rope_offset(&self) -> RopeOffset;
    /// Stores `[B, kv_heads, L, D]` keys/values; returns all cached keys/values including them.
    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)>;
    /// Stores this step's keys/values and attends `queries` over the whole cache with the
    /// fused kernel. Quantized caches override it to attend on their packed form.
    fn update_and_attend(
        &mut self,
        queries: &Array,
        keys: &Array,
        values: &Array,
        scale: f32,
        mask: &AttentionMask,
    ) -> Result<Array> {
        let (k, v) = self.update_and_fetch(keys, values)?;
        sdpa(queries, &k, &v, scale, mask)
    }
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

    // --- batch surgery: single-sequence caches convert into one-row batches, batched caches
    // --- join, drop and hand back rows. Defaults say the operation does not apply.

    /// Rows held (1 for single-sequence caches).
    fn rows(&self) -> usize {
        1
    }
    /// This single-sequence cache as a one-row batched cache.
    fn into_batched(self: Box<Self>) -> Result<Box<dyn KvCache>> {
        Err(Error::Unsupported("this cache cannot join a batch".into()))
    }
    /// Appends the rows of `other` (a batched cache of the same kind) after this one's.
    fn extend_rows(&mut self, _other: Box<dyn KvCache>) -> Result<()> {
        Err(Error::Unsupported("this cache is not batched".into()))
    }
    /// Keeps only rows `keep` (in that order).
    fn filter_rows(&mut self, _keep: &[usize]) -> Result<()> {
        Err(Error::Unsupported("this cache is not batched".into()))
    }
    /// Row `row` as a single-sequence cache.
    fn extract_row(&self, _row: usize) -> Result<Box<dyn KvCache>> {
        Err(Error::Unsupported("this cache is not batched".into()))
    }
    /// Whether rows with caches of this kind can prefill together as one batch: their batched
    /// form takes right-padded chunks ([`KvCache::prepare_right_padding`] before the forward,
    /// [`KvCache::finalize_padding`] after, mlx-lm's `prepare` / `finalize`). Kinds that cannot
    /// (ring buffers, recurrent state, quantized KV) prefill alone.
    fn batched_prefill(&self) -> bool {
        false
    }
    /// The next forward's rows are right-padded by this many tokens each (batched caches).
    fn prepare_right_padding(&mut self, _right_padding: &[i32]) -> Result<()> {
        Err(Error::Unsupported("this cache cannot prefill rows together".into()))
    }
    /// Turns the right padding announced by `prepare_right_padding` into left padding, so
    /// every row's last real token sits in the last column again.
    fn finalize_padding(&mut self) -> Result<()> {
        Ok(())
    }
    /// Drops the last `n` positions; returns how many were dropped (0 when the cache cannot
    /// forget tokens, e.g. recurrent state).
    fn trim(&mut self, _n: usize) -> usize {
        0
    }
    /// `(group_size, bits)` when keys and values are stored quantized.
    fn kv_quantization(&self) -> Option<(i32, i32)> {
        None
    }
    /// This cache with keys and values affine-quantized (mlx-lm `to_quantized`); `None` when
    /// the cache has no quantized form.
    fn to_quantized(&self, _group_size: i32, _bits: i32) -> Option<Result<Box<dyn KvCache>>> {
        None
    }
    /// The conv/recurrent state of a linear-attention layer; `None` for KV caches.
    fn recurrent_state(&mut self) -> Option<&mut RecurrentState> {
        None
    }
    /// A copy that shares storage (arrays are immutable; writes replace them).
    fn duplicate(&self) -> Box<dyn KvCache>;
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
}

/// Writes `[B, H, L, D]` keys/values into growable storage at column `at` and returns the
/// filled columns `..at + L`. Storage grows in 256-column steps and is written in place, as
/// mlx-lm's caches do, so a decode step copies one column, not the history.
pub(crate) fn write_columns(
    keys_buf: &mut Option<Array>,
    values_buf: &mut Option<Array>,
    at: i32,
    keys: &Array,
    values: &Array,
) -> Result<(Array, Array)> {
    use mlx_rs::ops::indexing::{IndexOp, TryIndexMutOp};
    const STEP: i32 = 256;
    let new = keys.dim(2);
    let capacity = keys_buf.as_ref().map_or(0, |k| k.dim(2));
    if keys_buf.is_none() || at + new > capacity {
        let (b, h, dk, dv) = (keys.dim(0), keys.dim(1), keys.dim(3), values.dim(3));
        let n_steps = (STEP + new - 1) / STEP;
        let new_k = mlx_rs::ops::zeros_dtype(&[b, h, n_steps * STEP, dk], keys.dtype())?;
        let new_v = mlx_rs::ops::zeros_dtype(&[b, h, n_steps * STEP, dv], values.dtype())?;
        match (keys_buf.take(), values_buf.take()) {
            (Some(mut k), Some(mut v)) => {
                if at % STEP != 0 {
                    k = k.index((.., .., ..at, ..));
                    v = v.index((.., .., ..at, ..));
                }
                *keys_buf = Some(mlx_rs::ops::concatenate(&[k, new_k], 2)?);
                *values_buf = Some(mlx_rs::ops::concatenate(&[v, new_v], 2)?);
            }
            _ => {
                *keys_buf = Some(new_k);
                *values_buf = Some(new_v);
            }
        }
    }
    let end = at + new;
    let (k, v) = (keys_buf.as_mut().unwrap(), values_buf.as_mut().unwrap());
    k.try_index_mut((.., .., at..end, ..), keys)?;
    v.try_index_mut((.., .., at..end, ..), values)?;
    if end < k.dim(2) {
        Ok((k.index((.., .., ..end, ..)), v.index((.., .., ..end, ..))))
    } else {
        Ok((k.clone(), v.clone()))
    }
}

/// The left-padded batch mask (mlx-lm `BatchKVCache.make_mask`):
/// `mask[b, 0, i, j] = j <= idx + i ∧ j >= left_padding[b]` (∧ `idx + i - j < window`).
pub(crate) fn left_padded_mask(idx: i32, left_padding: &[i32], n: i32, window: Option<i32>) -> Result<Array> {
    let total = idx + n;
    let rows = left_padding.len() as i32;
    let cols = Array::from_iter(0..total, &[1, 1, 1, total]);
    let queries = Array::from_iter(idx..total, &[1, 1, n, 1]);
    let lp = Array::from_slice(left_padding, &[rows, 1, 1, 1]);
    let mut mask = queries.ge(&cols)?.logical_and(&lp.le(&cols)?)?;
    if let Some(w) = window {
        mask = mask.logical_and(&queries.lt(&cols.add(Array::from_int(w))?)?)?;
    }
    Ok(mask)
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
