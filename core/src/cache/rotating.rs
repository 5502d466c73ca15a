//! The single-sequence sliding-window cache (mlx-lm `RotatingKVCache`, keep = 0): a ring of
//! `max_size` slots. Decode steps write in place at `idx` and wrap; multi-token updates first
//! put the ring back in temporal order and keep `max_size - 1` old positions plus the new
//! ones, so every new query still sees a full window. The physical slot order is kept exactly
//! as mlx-lm keeps it, because attention sums over keys in storage order.

use mlx_rs::ops::indexing::{IndexOp, TryIndexMutOp};
use mlx_rs::ops::{concatenate, zeros_dtype};
use mlx_rs::Array;

use super::{causal_mask, AttentionCache, AttentionMask, BatchRotatingKvCache, KvCache, RopeOffset};
use crate::Result;

const STEP: i32 = 256;

#[derive(Clone)]
pub struct RotatingKvCache {
    keys: Option<Array>,
    values: Option<Array>,
    /// Tokens processed (the RoPE position of the next one).
    offset: i32,
    /// Next write slot (ring index); equals the stored length outside the ring phase.
    idx: i32,
    max_size: i32,
}

impl RotatingKvCache {
    pub fn new(max_size: i32) -> Self {
        RotatingKvCache { keys: None, values: None, offset: 0, idx: 0, max_size }
    }

    /// A ring saved by [`KvCache::export`].
    pub(crate) fn from_saved(keys: Option<Array>, values: Option<Array>, offset: i32, idx: i32, max_size: i32) -> Self {
        RotatingKvCache { keys, values, offset, idx, max_size }
    }

    pub fn max_size(&self) -> i32 {
        self.max_size
    }

    pub(crate) fn from_parts(keys: Array, values: Array, offset: i32, max_size: i32) -> Self {
        let idx = keys.dim(2);
        RotatingKvCache { keys: Some(keys), values: Some(values), offset, idx, max_size }
    }

    /// Positions actually held (mlx-lm `size()`).
    pub fn size(&self) -> i32 {
        self.offset.min(self.max_size)
    }

    /// `v` with the ring rotated back into temporal order (unused tail sliced off).
    pub(crate) fn temporal_order(&self, v: &Array) -> Result<Array> {
        let n = v.dim(2);
        Ok(if self.idx == n {
            v.clone()
        } else if self.idx < self.offset {
            concatenate(&[v.index((.., .., self.idx.., ..)), v.index((.., .., ..self.idx, ..))], 2)?
        } else {
            v.index((.., .., ..self.idx, ..))
        })
    }

    /// The held keys/values in temporal order, last `size()` positions (for merging).
    pub(crate) fn ordered_tail(&self) -> Result<Option<(Array, Array)>> {
        let (Some(k), Some(v)) = (&self.keys, &self.values) else { return Ok(None) };
        let l = self.size();
        let (k, v) = (self.temporal_order(k)?, self.temporal_order(v)?);
        let (nk, nv) = (k.dim(2), v.dim(2));
        Ok(Some((k.index((.., .., nk - l.., ..)), v.index((.., .., nv - l.., ..)))))
    }

    fn update_concat(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        match (self.keys.take(), self.values.take()) {
            (Some(k), Some(v)) => {
                let k = self.temporal_order(&k)?;
                let v = self.temporal_order(&v)?;
                self.idx = k.dim(2);
                // Keep max_size - 1 old positions so every new token sees a full window.
                let trim = (self.idx - self.max_size + 1).max(0);
                self.keys = Some(concatenate(&[k.index((.., .., trim.., ..)), keys.clone()], 2)?);
                self.values = Some(concatenate(&[v.index((.., .., trim.., ..)), values.clone()], 2)?);
            }
            _ => {
                self.keys = Some(keys.clone());
                self.values = Some(values.clone());
            }
        }
        self.offset += keys.dim(2);
        let (k, v) = (self.keys.clone().unwrap(), self.values.clone().unwrap());
        self.idx = k.dim(2);
        Ok((k, v))
    }

    fn update_in_place(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        let s = keys.dim(2);
        let prev = self.offset;
        if grow_ring(&mut self.keys, &mut self.values, prev, self.max_size, keys, values)? {
            self.idx = prev;
        }
        let (k, v) = (self.keys.as_mut().unwrap(), self.values.as_mut().unwrap());
        // After a multi-token update the buffer may exceed the window: drop the oldest.
        let trim = k.dim(2) - self.max_size;
        if trim > 0 {
            *k = k.index((.., .., trim.., ..));
            *v = v.index((.., .., trim.., ..));
            self.idx = self.max_size;
        }
        if self.idx == self.max_size {
            self.idx = 0;
        }
        k.try_index_mut((.., .., self.idx..self.idx + s, ..), keys)?;
        v.try_index_mut((.., .., self.idx..self.idx + s, ..), values)?;
        self.offset += s;
        self.idx += s;
        if self.offset < k.dim(2) {
            Ok((k.index((.., .., ..self.offset, ..)), v.index((.., .., ..self.offset, ..))))
        } else {
            Ok((k.clone(), v.clone()))
        }
    }
}

/// Grows a ring's storage by up to `STEP` slots, never past `max_size`, once `written`
/// positions fill it (as mlx-lm grows its rotating caches); returns whether it grew.
pub(crate) fn grow_ring(
    keys_buf: &mut Option<Array>,
    values_buf: &mut Option<Array>,
    written: i32,
    max_size: i32,
    keys: &Array,
    values: &Array,
) -> Result<bool> {
    let grow = match keys_buf.as_ref() {
        None => true,
        Some(k) => written >= k.dim(2) && k.dim(2) < max_size,
    };
    if !grow {
        return Ok(false);
    }
    let (b, h, dk, dv) = (keys.dim(0), keys.dim(1), keys.dim(3), values.dim(3));
    let new_size = STEP.min(max_size - written);
    let nk = zeros_dtype(&[b, h, new_size, dk], keys.dtype())?;
    let nv = zeros_dtype(&[b, h, new_size, dv], values.dtype())?;
    match (keys_buf.take(), values_buf.take()) {
        (Some(k), Some(v)) => {
            *keys_buf = Some(concatenate(&[k, nk], 2)?);
            *values_buf = Some(concatenate(&[v, nv], 2)?);
        }
        _ => {
            *keys_buf = Some(nk);
            *values_buf = Some(nv);
        }
    }
    Ok(true)
}

impl AttentionCache for RotatingKvCache {
    fn rope_offset(&self) -> RopeOffset {
        RopeOffset::Scalar(self.offset)
    }

    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        if keys.dim(2) == 1 {
            self.update_in_place(keys, values)
        } else {
            self.update_concat(keys, values)
        }
    }

    /// mlx-lm `RotatingKVCache.make_mask`: several queries see the last `max_size - 1` cached
    /// positions plus themselves under a causal window mask; a single query sees the whole
    /// ring (a mask is only needed when the window is smaller than the ring).
    fn make_mask(&self, n: i32, window: Option<i32>) -> Result<AttentionMask> {
        if n > 1 {
            let window = window.unwrap_or(self.max_size);
            let offset = (self.max_size - 1).min(self.offset);
            if offset + n > window {
                return Ok(AttentionMask::Array(causal_mask(n, offset, Some(window))?));
            }
            return Ok(AttentionMask::Causal);
        }
        let Some(window) = window else { return Ok(AttentionMask::None) };
        if self.offset >= window && self.max_size > window {
            let idx = if self.idx >= self.max_size { 0 } else { self.idx };
            let size = if self.offset < self.max_size { self.offset + 1 } else { self.max_size };
            // Slot j (before the roll) is visible when it is among the last `window`.
            let shift = (idx + 1).rem_euclid(size);
            let mask: Vec<bool> = (0..size).map(|j| (j - shift).rem_euclid(size) >= size - window).collect();
            return Ok(AttentionMask::Array(Array::from_slice(&mask, &[size])));
        }
        Ok(AttentionMask::None)
    }
}

impl KvCache for RotatingKvCache {
    super::faces!(attention);

    /// Positions covered (tokens processed), which is what prefix bookkeeping counts; at most
    /// `max_size` of them are actually held.
    fn len(&self) -> usize {
        self.offset as usize
    }

    fn nbytes(&self) -> usize {
        self.keys.as_ref().map_or(0, |k| k.nbytes()) + self.values.as_ref().map_or(0, |v| v.nbytes())
    }

    fn state(&self) -> Vec<Array> {
        self.keys.iter().chain(self.values.iter()).cloned().collect()
    }

    fn into_batched(self: Box<Self>) -> Result<Box<dyn KvCache>> {
        Ok(Box::new(BatchRotatingKvCache::merge(&[*self])?))
    }

    /// Only a ring that has not wrapped can drop positions (mlx-lm `is_trimmable`); a wrapped
    /// one reports 0 so callers do not reuse it at a shorter length.
    fn trim(&mut self, n: usize) -> usize {
        if n == 0 || self.offset >= self.max_size {
            return 0;
        }
        let n = (n as i32).min(self.offset);
        self.offset -= n;
        self.idx -= n;
        n as usize
    }

    fn duplicate(&self) -> Box<dyn KvCache> {
        Box::new(self.clone())
    }

    fn export(&self) -> Option<super::CacheParts> {
        // The ring as it is stored: attention sums its keys in storage order.
        let arrays = self.keys.iter().map(|k| ("keys".to_string(), k.clone())).chain(self.values.iter().map(|v| ("values".to_string(), v.clone())));
        let ints = vec![self.offset as i64, self.idx as i64, self.max_size as i64];
        Some(super::CacheParts { kind: "rotating".into(), arrays: arrays.collect(), ints })
    }

    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any> {
        self
    }
}
