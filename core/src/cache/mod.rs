//! Layer caches behind narrow traits, one per role:
//!
//! - [`AttentionCache`]: what an attention layer needs for a step (RoPE offset, mask, storage
//!   for the step's keys and values, attention over them). Only KV caches implement it.
//! - [`RecurrentState`]: the conv/recurrent arrays a linear-attention layer reads and replaces.
//! - [`BatchRows`]: join, drop and hand back the rows of a batched cache (the engine's surgery).
//! - [`RightPadding`]: right-padded batched prefill, for the caches whose batched form has it.
//! - [`KvCache`]: one layer's cache as models and the engine hold it: size, evaluation, trim,
//!   copy, conversion to a batch, and the faces above (each `None` where the role does not apply).
//!
//! KV quantization lives inside the caches: [`quantizing`] wraps a model's fresh caches so each
//! converts itself to quantized storage once it holds `quantized_kv_start` positions; callers
//! never convert or special-case quantized rows.

mod batch_kv;
mod batch_rotating;
mod kv;
mod quantized;
mod recurrent;
mod rotating;

pub use batch_kv::BatchKvCache;
pub use batch_rotating::BatchRotatingKvCache;
pub use kv::KvCacheSingle;
pub use quantized::{quantized_sdpa, quantizing, BatchQuantizedKvCache, KvQuantization, QuantizedKvCache, QuantizingKvCache};
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

/// What the fused attention kernel masks with: defined with the kernels (below the caches,
/// which make the masks), re-exported here where the caches hand them out.
pub use crate::kernels::AttentionMask;

/// Fused scaled-dot-product attention over cached keys and values, with the cache-provided
/// mask (here, below `nn`, because the caches attend too). `fast`: the layer was loaded in fast
/// mode on the CPU (`nn::LayerOptions::fast_on_cpu`), so Weft's primitive runs
/// ([`crate::kernels::sdpa`]); else MLX's op, bit for bit mlx-lm's.
pub fn sdpa(q: &Array, k: &Array, v: &Array, scale: f32, mask: &AttentionMask, fast: bool) -> Result<Array> {
    use mlx_rs::fast::{scaled_dot_product_attention, ScaledDotProductAttentionMask as M};
    if fast {
        return crate::kernels::sdpa(q, k, v, scale, mask);
    }
    Ok(match mask {
        AttentionMask::None => scaled_dot_product_attention(q, k, v, scale, None, None)?,
        AttentionMask::Causal => scaled_dot_product_attention(q, k, v, scale, M::Causal, None)?,
        AttentionMask::Array(m) => scaled_dot_product_attention(q, k, v, scale, M::Array(m), None)?,
    })
}

/// What an attention layer needs from its cache for one step.
pub trait AttentionCache {
    /// RoPE offset for the next `update_and_fetch`.
    fn rope_offset(&self) -> RopeOffset;
    /// The mask for `n` new query positions (call before `update_and_fetch`).
    fn make_mask(&self, n: i32, window: Option<i32>) -> Result<AttentionMask>;
    /// Stores `[B, kv_heads, L, D]` keys/values; returns all cached keys/values including them.
    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)>;
    /// Stores this step's keys/values and attends `queries` over the whole cache with the
    /// fused kernel ([`sdpa`]; `fast` as there). Quantized caches override it to attend on
    /// their packed form.
    fn update_and_attend(
        &mut self,
        queries: &Array,
        keys: &Array,
        values: &Array,
        scale: f32,
        mask: &AttentionMask,
        fast: bool,
    ) -> Result<Array> {
        let (k, v) = self.update_and_fetch(keys, values)?;
        sdpa(queries, &k, &v, scale, mask, fast)
    }
    /// `(group_size, bits)` while keys and values are stored quantized (layers that read the
    /// fetched keys themselves, not through `update_and_attend`, must know).
    fn kv_quantization(&self) -> Option<(i32, i32)> {
        None
    }
}

/// Row surgery on a batched cache: the engine joins rows, drops the ones that leave and hands
/// a leaving row back as a single-sequence cache.
pub trait BatchRows {
    /// Rows held.
    fn rows(&self) -> usize;
    /// Appends the rows of `other` (a batched cache of the same kind) after this one's.
    fn extend_rows(&mut self, other: Box<dyn KvCache>) -> Result<()>;
    /// Keeps only rows `keep` (in that order).
    fn filter_rows(&mut self, keep: &[usize]) -> Result<()>;
    /// Row `row` as a single-sequence cache.
    fn extract_row(&self, row: usize) -> Result<Box<dyn KvCache>>;
    /// The only row of a one-row batch that is dropped next, as a single-sequence cache: kinds
    /// that can hand their storage over whole (no copy of the history) do; the rest extract.
    fn take_only_row(&mut self) -> Result<Box<dyn KvCache>> {
        self.extract_row(0)
    }
    /// Whether [`BatchRows::trim_rows`] works on this kind (speculative decoding needs it; a
    /// recurrent state or a ring cannot forget tokens, so those models do not speculate).
    fn trims_rows(&self) -> bool {
        false
    }
    /// Drops the last `n[b]` positions of each row `b` (rejected draft tokens).
    fn trim_rows(&mut self, _n: &[usize]) -> Result<()> {
        Err(Error::Unsupported("this cache cannot drop positions row by row".into()))
    }
}

/// Right-padded batched prefill (mlx-lm's `prepare` / `finalize`): rows prefill together as one
/// `[B, L]` forward whose shorter chunks are padded on the right.
pub trait RightPadding {
    /// The next forward's rows are right-padded by this many tokens each.
    fn prepare_right_padding(&mut self, right_padding: &[i32]) -> Result<()>;
    /// Turns the announced right padding into left padding, so every row's last real token
    /// sits in the last column again.
    fn finalize_padding(&mut self) -> Result<()>;
}

/// Inside an `impl KvCache`: the role faces the type itself implements, each returning
/// `Some(self)` (`attention` writes `attention` + `attention_ref`, `batch_rows` writes
/// `batch_rows` + `batch_rows_ref`, `right_padding` writes `right_padding`).
macro_rules! faces {
    (@face attention) => {
        fn attention(&mut self) -> Option<&mut dyn $crate::cache::AttentionCache> {
            Some(self)
        }
        fn attention_ref(&self) -> Option<&dyn $crate::cache::AttentionCache> {
            Some(self)
        }
    };
    (@face batch_rows) => {
        fn batch_rows(&mut self) -> Option<&mut dyn $crate::cache::BatchRows> {
            Some(self)
        }
        fn batch_rows_ref(&self) -> Option<&dyn $crate::cache::BatchRows> {
            Some(self)
        }
    };
    (@face right_padding) => {
        fn right_padding(&mut self) -> Option<&mut dyn $crate::cache::RightPadding> {
            Some(self)
        }
    };
    ($($face:ident),+) => {
        $($crate::cache::faces!(@face $face);)+
    };
}
pub(crate) use faces;

/// One layer's cache, as models and the engine hold it. The role faces return `None` where
/// the role does not apply (a recurrent state has no attention face; a single-sequence cache
/// has no batch rows until `into_batched`).
pub trait KvCache: Any + Send {
    /// The attention face (KV caches).
    fn attention(&mut self) -> Option<&mut dyn AttentionCache> {
        None
    }
    /// The attention face, read-only (masks, offsets).
    fn attention_ref(&self) -> Option<&dyn AttentionCache> {
        None
    }
    /// The conv/recurrent state of a linear-attention layer.
    fn recurrent_state(&mut self) -> Option<&mut RecurrentState> {
        None
    }
    /// Row surgery (batched caches).
    fn batch_rows(&mut self) -> Option<&mut dyn BatchRows> {
        None
    }
    /// Row extraction without mutation (batched caches).
    fn batch_rows_ref(&self) -> Option<&dyn BatchRows> {
        None
    }
    /// Right-padded prefill (batched caches whose kind supports it).
    fn right_padding(&mut self) -> Option<&mut dyn RightPadding> {
        None
    }
    /// Whether rows with caches of this kind can prefill together as one batch: their batched
    /// form has a [`RightPadding`] face. Kinds that cannot (ring buffers, quantized KV)
    /// prefill alone.
    fn batched_prefill(&self) -> bool {
        false
    }

    /// Number of token positions cached (the longest row's, in a batch).
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Bytes held by the cache's arrays.
    fn nbytes(&self) -> usize;
    /// Arrays to evaluate so the cache is materialized (after a prefill chunk).
    fn state(&self) -> Vec<Array>;
    /// Drops the last `n` positions; returns how many were dropped (0 when the cache cannot
    /// forget tokens, e.g. recurrent state or a wrapped ring).
    fn trim(&mut self, _n: usize) -> usize {
        0
    }
    /// Whether `trim` always drops the positions asked (plain and quantized KV); false where
    /// it may refuse (recurrent state, a sliding-window ring once it wraps), for which the
    /// prompt cache snapshots rows at their chat boundaries instead of cutting entries back.
    fn always_trims(&self) -> bool {
        false
    }
    /// A single-sequence cache's contents, to save to a file ([`import`] rebuilds it); `None`
    /// for kinds that are not saved (batched caches).
    fn export(&self) -> Option<CacheParts> {
        None
    }
    /// This cache as a batched cache (a single-sequence cache becomes a one-row batch; a batched
    /// cache is returned as it is).
    fn into_batched(self: Box<Self>) -> Result<Box<dyn KvCache>>;
    /// A copy that shares storage (arrays are immutable; writes replace them).
    fn duplicate(&self) -> Box<dyn KvCache>;
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
}

/// A saved single-sequence cache: its kind, its arrays by name and its integer fields.
pub struct CacheParts {
    pub kind: String,
    pub arrays: Vec<(String, Array)>,
    pub ints: Vec<i64>,
}

/// Rebuilds a cache [`KvCache::export`] gave, refusing parts that do not fit its kind.
pub fn import(parts: CacheParts) -> Result<Box<dyn KvCache>> {
    let CacheParts { kind, arrays, ints } = parts;
    let array = |name: &str| arrays.iter().find(|(n, _)| n == name).map(|(_, a)| a.clone());
    let bad = || Error::InvalidRequest(format!("a saved {kind} cache is incomplete"));
    let int = |i: usize| ints.get(i).copied().and_then(|v| i32::try_from(v).ok()).ok_or_else(bad);
    Ok(match kind.as_str() {
        "kv" => Box::new(KvCacheSingle::from_keys_values(array("keys").ok_or_else(bad)?, array("values").ok_or_else(bad)?)),
        "rotating" => Box::new(RotatingKvCache::from_saved(array("keys"), array("values"), int(0)?, int(1)?, int(2)?)),
        "recurrent" => Box::new(RecurrentCache::from_saved(array("conv"), array("ssm"), int(0)?)),
        "quantized" => {
            let q = KvQuantization { bits: int(0)?, group_size: int(1)?, start: 0 };
            q.validate(None)?;
            Box::new(QuantizedKvCache::from_saved(&arrays, q.group_size, q.bits).ok_or_else(bad)?)
        }
        "quantizing" => {
            let q = KvQuantization { bits: int(0)?, group_size: int(1)?, start: int(2)? as usize };
            q.validate(None)?;
            Box::new(QuantizingKvCache::from_saved(q, int(3)? != 0, &arrays).ok_or_else(bad)?)
        }
        other => return Err(Error::InvalidRequest(format!("a saved cache of unknown kind {other:?}"))),
    })
}

/// The attention face of a layer's cache. A model builds its own caches, so an error here is a
/// wiring mistake (an attention layer given a recurrent-state cache), reported, not a panic.
pub fn attention(cache: &mut dyn KvCache) -> Result<&mut dyn AttentionCache> {
    cache
        .attention()
        .ok_or_else(|| Error::Unsupported("an attention layer was given a cache without keys and values".into()))
}

/// The mask for `n` new positions from an attention layer's cache (models build one mask per
/// forward, or one per layer kind, from the first cache of that kind).
pub fn make_mask(cache: &dyn KvCache, n: i32, window: Option<i32>) -> Result<AttentionMask> {
    cache
        .attention_ref()
        .ok_or_else(|| Error::Unsupported("a mask was asked of a cache without keys and values".into()))?
        .make_mask(n, window)
}

/// The recurrent-state face of a layer's cache (a wiring mistake otherwise, as [`attention`]).
pub fn recurrent(cache: &mut dyn KvCache) -> Result<&mut RecurrentState> {
    cache
        .recurrent_state()
        .ok_or_else(|| Error::Unsupported("a linear-attention layer was given a cache without recurrent state".into()))
}

fn batch_of(cache: &mut dyn KvCache) -> Result<&mut dyn BatchRows> {
    cache.batch_rows().ok_or_else(|| Error::Unsupported("this cache is not batched (into_batched first)".into()))
}

/// `dst.extend_rows(other)` on a batched cache.
pub fn extend_rows(dst: &mut dyn KvCache, other: Box<dyn KvCache>) -> Result<()> {
    batch_of(dst)?.extend_rows(other)
}

/// Keeps rows `keep` of every layer's batched cache.
pub fn filter_rows(caches: &mut [Box<dyn KvCache>], keep: &[usize]) -> Result<()> {
    caches.iter_mut().try_for_each(|c| batch_of(c.as_mut())?.filter_rows(keep))
}

/// Drops the last `n[b]` positions of row `b` in every layer's batched cache.
pub fn trim_rows(caches: &mut [Box<dyn KvCache>], n: &[usize]) -> Result<()> {
    caches.iter_mut().try_for_each(|c| batch_of(c.as_mut())?.trim_rows(n))
}

/// Whether every cache of `fresh` (a model's `make_caches`) can drop positions row by row once
/// batched ([`BatchRows::trim_rows`]).
pub fn trims_rows(fresh: Vec<Box<dyn KvCache>>) -> bool {
    fresh.into_iter().all(|c| c.into_batched().ok().and_then(|b| b.batch_rows_ref().map(|r| r.trims_rows())).unwrap_or(false))
}

/// The only row of every layer's one-row batched cache, which is dropped next
/// ([`BatchRows::take_only_row`]).
pub fn take_only_row(caches: &mut [Box<dyn KvCache>]) -> Result<Vec<Box<dyn KvCache>>> {
    caches.iter_mut().map(|c| batch_of(c.as_mut())?.take_only_row()).collect()
}

/// Row `row` of every layer's batched cache, as single-sequence caches.
pub fn extract_row(caches: &[Box<dyn KvCache>], row: usize) -> Result<Vec<Box<dyn KvCache>>> {
    caches
        .iter()
        .map(|c| {
            c.batch_rows_ref()
                .ok_or_else(|| Error::Unsupported("this cache is not batched (into_batched first)".into()))?
                .extract_row(row)
        })
        .collect()
}

/// A right padding announced for `given` rows of a `rows`-row batch must name every row once.
pub(crate) fn check_padding_rows(given: usize, rows: usize) -> Result<()> {
    if given != rows {
        return Err(Error::Mlx(format!("right padding for {given} rows given to a batch of {rows}")));
    }
    Ok(())
}

fn padding_of(cache: &mut dyn KvCache) -> Result<&mut dyn RightPadding> {
    cache.right_padding().ok_or_else(|| Error::Unsupported("this cache cannot prefill rows together".into()))
}

/// Announces the next forward's right padding to every layer's batched cache.
pub fn prepare_right_padding(caches: &mut [Box<dyn KvCache>], right_padding: &[i32]) -> Result<()> {
    caches.iter_mut().try_for_each(|c| padding_of(c.as_mut())?.prepare_right_padding(right_padding))
}

/// Turns every layer's right padding into left padding after the forward.
pub fn finalize_padding(caches: &mut [Box<dyn KvCache>]) -> Result<()> {
    caches.iter_mut().try_for_each(|c| padding_of(c.as_mut())?.finalize_padding())
}

/// Writes `[B, H, L, D]` keys/values into growable storage at column `at` and returns the
/// filled columns `..at + L`. Storage grows in 256-column steps and is written in place, as
/// mlx-lm's caches do, so a decode step copies one column, not the history. Grown storage is
/// always a whole number of steps wide (mlx-lm's is whenever its first allocation was): MLX's
/// CUDA backend attends a decode step with cuDNN only over such a buffer, and with a slower
/// kernel otherwise.
pub(crate) fn write_columns(
    keys_buf: &mut Option<Array>,
    values_buf: &mut Option<Array>,
    at: i32,
    keys: &Array,
    values: &Array,
) -> Result<(Array, Array)> {
    use mlx_rs::ops::indexing::IndexOp;
    const STEP: i32 = 256;
    let new = keys.dim(2);
    let capacity = keys_buf.as_ref().map_or(0, |k| k.dim(2));
    if keys_buf.is_none() || at + new > capacity {
        let (b, h, dk, dv) = (keys.dim(0), keys.dim(1), keys.dim(3), values.dim(3));
        let width = (at + new + STEP - 1) / STEP * STEP - at;
        let new_k = mlx_rs::ops::zeros_dtype(&[b, h, width, dk], keys.dtype())?;
        let new_v = mlx_rs::ops::zeros_dtype(&[b, h, width, dv], values.dtype())?;
        match (keys_buf.take(), values_buf.take()) {
            (Some(mut k), Some(mut v)) if at > 0 => {
                if capacity > at {
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
    *k = slice_update_columns(k, keys, at)?;
    *v = slice_update_columns(v, values, at)?;
    if end < k.dim(2) {
        Ok((k.index((.., .., ..end, ..)), v.index((.., .., ..end, ..))))
    } else {
        Ok((k.clone(), v.clone()))
    }
}

/// `buf` with columns `at..at + L` (axis 2) replaced by `update` (`[B, H, L, D]`): one
/// `slice_update` (indexed assignment adds two reshapes of the update per call, on every layer
/// of every decode step).
fn slice_update_columns(buf: &Array, update: &Array, at: i32) -> Result<Array> {
    let (b, h, l, d) = (update.dim(0), update.dim(1), update.dim(2), update.dim(3));
    let (start, stop, strides) = ([0, 0, at, 0], [b, h, at + l, d], [1, 1, 1, 1]);
    let stream = mlx_rs::Stream::thread_local_or_default();
    // SAFETY: the handles are valid for the call; the result is owned by the returned array.
    unsafe {
        let mut res = mlx_sys::mlx_array_new();
        let status = mlx_sys::mlx_slice_update(
            &mut res,
            buf.as_ptr(),
            update.as_ptr(),
            start.as_ptr(),
            4,
            stop.as_ptr(),
            4,
            strides.as_ptr(),
            4,
            stream.as_ptr(),
        );
        if status != 0 {
            mlx_sys::mlx_array_free(res);
            return Err(Error::Mlx("writing keys and values into the cache failed".into()));
        }
        Ok(Array::from_ptr(res))
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
