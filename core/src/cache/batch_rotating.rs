//! The batched sliding-window cache (mlx-lm `BatchRotatingKVCache`). Rows are left-padded and
//! share one ring of `max_size` slots: `idx` is the shared write slot, `written` the number of
//! columns written so far (mlx-lm `_offset`), `offsets[b]` row b's RoPE position and
//! `left_padding[b]` its first real column. Once the ring wraps (`rotated`), every decode step
//! overwrites the oldest column, so the padding boundary moves left by one per step and the
//! mask is rolled with the ring. All bookkeeping is host-side integers; the mask is built on
//! the host from them.
//!
//! Only what the engine needs is implemented: rows enter through `merge` of prefilled
//! single-sequence caches (never through right-padded batched prefill, mlx-lm's
//! `prepare`/`finalize`), and a batch forward of several tokens (`update_concat`) is supported
//! for completeness.

use mlx_rs::ops::indexing::{IndexOp, TryIndexMutOp};
use mlx_rs::ops::{concatenate, zeros_dtype};
use mlx_rs::Array;

use super::rotating::grow_ring;
use super::{AttentionCache, AttentionMask, BatchRows, KvCache, RopeOffset, RotatingKvCache};
use crate::{Error, Result};


pub struct BatchRotatingKvCache {
    keys: Option<Array>,
    values: Option<Array>,
    left_padding: Vec<i32>,
    offsets: Vec<i32>,
    max_size: i32,
    idx: i32,
    written: i32,
    rotated: bool,
}

impl BatchRotatingKvCache {
    /// Empty batch of `rows` rows with the given left padding.
    pub fn new(max_size: i32, left_padding: Vec<i32>) -> Self {
        let offsets = left_padding.iter().map(|p| -p).collect();
        BatchRotatingKvCache { keys: None, values: None, left_padding, offsets, max_size, idx: 0, written: 0, rotated: false }
    }

    pub fn left_padding(&self) -> &[i32] {
        &self.left_padding
    }

    pub fn is_rotated(&self) -> bool {
        self.rotated
    }

    /// mlx-lm `merge`: each sequence's last `size()` positions, in temporal order, right-aligned.
    pub fn merge(caches: &[RotatingKvCache]) -> Result<Self> {
        let max_size = caches.first().map_or(0, |c| c.max_size());
        if caches.iter().any(|c| c.max_size() != max_size) {
            return Err(Error::Unsupported("merging sliding-window caches of different sizes".into()));
        }
        let lengths: Vec<i32> = caches.iter().map(|c| c.size()).collect();
        let max_len = lengths.iter().copied().max().unwrap_or(0);
        if max_len == 0 {
            return Ok(Self::new(max_size, vec![0; caches.len()]));
        }
        let padding: Vec<i32> = lengths.iter().map(|l| max_len - l).collect();
        let tails: Vec<Option<(Array, Array)>> = caches.iter().map(|c| c.ordered_tail()).collect::<Result<_>>()?;
        let (h, dk, dv, dtype) = tails
            .iter()
            .flatten()
            .map(|(k, v)| (k.dim(1), k.dim(3), v.dim(3), k.dtype()))
            .next()
            .ok_or_else(|| Error::Mlx("sliding-window cache without keys".into()))?;
        let mut ks = Vec::with_capacity(caches.len());
        let mut vs = Vec::with_capacity(caches.len());
        for (tail, &p) in tails.into_iter().zip(&padding) {
            let (k, v) = match tail {
                Some((k, v)) if k.dim(2) > 0 => (k, v),
                _ => (zeros_dtype(&[1, h, 0, dk], dtype)?, zeros_dtype(&[1, h, 0, dv], dtype)?),
            };
            ks.push(left_pad(&k, p)?);
            vs.push(left_pad(&v, p)?);
        }
        Ok(BatchRotatingKvCache {
            keys: Some(if ks.len() == 1 { ks.pop().unwrap() } else { concatenate(&ks, 0)? }),
            values: Some(if vs.len() == 1 { vs.pop().unwrap() } else { concatenate(&vs, 0)? }),
            left_padding: padding,
            offsets: caches.iter().map(|c| c.len() as i32).collect(),
            max_size,
            idx: max_len,
            written: max_len,
            rotated: false,
        })
    }

    /// Rolls the ring back into temporal order (mlx-lm `_temporal_order`).
    fn temporal_order(&mut self) -> Result<()> {
        if self.rotated {
            if let (Some(k), Some(v)) = (&self.keys, &self.values) {
                let roll = |a: &Array| -> Result<Array> {
                    Ok(concatenate(&[a.index((.., .., self.idx.., ..)), a.index((.., .., ..self.idx, ..))], 2)?)
                };
                let (k, v) = (roll(k)?, roll(v)?);
                self.idx = k.dim(2);
                self.keys = Some(k);
                self.values = Some(v);
            }
            self.rotated = false;
        }
        Ok(())
    }

    fn update_concat(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        if self.keys.is_none() {
            self.keys = Some(keys.clone());
            self.values = Some(values.clone());
        } else {
            self.temporal_order()?;
            let (mut k, mut v) = (self.keys.take().unwrap(), self.values.take().unwrap());
            if k.dim(2) > self.idx {
                k = k.index((.., .., ..self.idx, ..));
                v = v.index((.., .., ..self.idx, ..));
            }
            let trim = self.idx - self.max_size + 1;
            if trim > 0 {
                for p in &mut self.left_padding {
                    *p -= trim;
                }
                k = k.index((.., .., trim.., ..));
                v = v.index((.., .., trim.., ..));
            }
            self.keys = Some(concatenate(&[k, keys.clone()], 2)?);
            self.values = Some(concatenate(&[v, values.clone()], 2)?);
        }
        let s = keys.dim(2);
        for o in &mut self.offsets {
            *o += s;
        }
        self.written += s;
        let (k, v) = (self.keys.clone().unwrap(), self.values.clone().unwrap());
        self.idx = k.dim(2);
        Ok((k, v))
    }

    fn update_in_place(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        let s = keys.dim(2);
        let prev = self.written;
        if grow_ring(&mut self.keys, &mut self.values, prev, self.max_size, keys, values)? {
            self.idx = prev;
        }
        let (k, v) = (self.keys.as_mut().unwrap(), self.values.as_mut().unwrap());
        let trim = k.dim(2) - self.max_size;
        if trim > 0 {
            *k = k.index((.., .., trim.., ..));
            *v = v.index((.., .., trim.., ..));
            self.idx = self.max_size;
            for p in &mut self.left_padding {
                *p -= trim;
            }
        }
        if self.idx == self.max_size {
            self.rotated = true;
            self.idx = 0;
        }
        if self.rotated {
            for p in &mut self.left_padding {
                *p -= s;
            }
        }
        k.try_index_mut((.., .., self.idx..self.idx + s, ..), keys)?;
        v.try_index_mut((.., .., self.idx..self.idx + s, ..), values)?;
        self.written += s;
        for o in &mut self.offsets {
            *o += s;
        }
        self.idx += s;
        if self.written < k.dim(2) {
            Ok((k.index((.., .., ..self.written, ..)), v.index((.., .., ..self.written, ..))))
        } else {
            Ok((k.clone(), v.clone()))
        }
    }
}

/// `[B, H, T, D]` with `left` zero columns in front.
fn left_pad(a: &Array, left: i32) -> Result<Array> {
    if left == 0 {
        return Ok(a.clone());
    }
    let z = zeros_dtype(&[a.dim(0), a.dim(1), left, a.dim(3)], a.dtype())?;
    Ok(concatenate(&[z, a.clone()], 2)?)
}

/// `[B, H, T, D]` with `left` zero columns in front and `right` behind.
fn pad_both(a: &Array, left: i32, right: i32) -> Result<Array> {
    let a = left_pad(a, left)?;
    if right == 0 {
        return Ok(a);
    }
    let z = zeros_dtype(&[a.dim(0), a.dim(1), right, a.dim(3)], a.dtype())?;
    Ok(concatenate(&[a, z], 2)?)
}

impl AttentionCache for BatchRotatingKvCache {
    fn rope_offset(&self) -> RopeOffset {
        RopeOffset::PerRow(Array::from_slice(&self.offsets, &[self.offsets.len() as i32]))
    }

    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        if keys.dim(2) == 1 {
            self.update_in_place(keys, values)
        } else {
            self.update_concat(keys, values)
        }
    }

    /// mlx-lm `BatchRotatingKVCache.make_mask`: causal ∧ window ∧ `key >= left_padding[b]`
    /// (the boundary corrected for trimming and rotation), rolled with the ring once wrapped.
    fn make_mask(&self, n: i32, window: Option<i32>) -> Result<AttentionMask> {
        let window = window.unwrap_or(self.max_size);
        let offset = (self.max_size - 1).min(self.written);
        let width = offset + n;
        let mut lp = self.left_padding.clone();
        let trim = self.idx - self.max_size + i32::from(n > 1);
        if trim > 0 {
            lp.iter_mut().for_each(|p| *p -= trim);
        }
        let rotated = n == 1 && (self.rotated || self.idx >= self.max_size);
        if rotated {
            lp.iter_mut().for_each(|p| *p -= 1);
        }
        let shift = if rotated { (if self.idx >= self.max_size { 0 } else { self.idx }) + 1 } else { 0 };
        let rows = lp.len() as i32;
        let mut mask = Vec::with_capacity((rows * n * width) as usize);
        for &p in &lp {
            for i in 0..n {
                let q = offset + i;
                for j in 0..width {
                    // Rolling right by `shift` moves source column j - shift to column j.
                    let src = (j - shift).rem_euclid(width);
                    mask.push(q >= src && q < src + window && src >= p);
                }
            }
        }
        Ok(AttentionMask::Array(Array::from_slice(&mask, &[rows, 1, n, width])))
    }
}

impl BatchRows for BatchRotatingKvCache {
    fn rows(&self) -> usize {
        self.offsets.len()
    }

    /// mlx-lm `extend`: both sides into temporal order when their rings disagree, then
    /// right-aligned on the larger write slot (the shorter side is left-padded).
    fn extend_rows(&mut self, other: Box<dyn KvCache>) -> Result<()> {
        let mut other = other
            .into_any()
            .downcast::<BatchRotatingKvCache>()
            .map_err(|_| Error::Unsupported("joining caches of different kinds".into()))?;
        if other.max_size != self.max_size {
            return Err(Error::Unsupported("joining sliding-window caches of different sizes".into()));
        }
        if self.keys.is_none() && other.keys.is_none() {
            self.left_padding.extend_from_slice(&other.left_padding);
            self.offsets.extend_from_slice(&other.offsets);
            return Ok(());
        }
        if self.rotated != other.rotated || self.idx != other.idx {
            self.temporal_order()?;
            other.temporal_order()?;
        }
        let max_idx = self.idx.max(other.idx);
        let shape_of = |c: &BatchRotatingKvCache| {
            c.keys.as_ref().zip(c.values.as_ref()).map(|(k, v)| (k.dim(1), k.dim(2), k.dim(3), v.dim(3), k.dtype()))
        };
        let (l1, l2) = (shape_of(self).map_or(0, |s| s.1), shape_of(&other).map_or(0, |s| s.1));
        let (h, _, dk, dv, dtype) = shape_of(self)
            .or_else(|| shape_of(&other))
            .ok_or_else(|| Error::Mlx("sliding-window cache without keys".into()))?;
        let width = l1.max(l2);
        let pad = |c: &BatchRotatingKvCache| -> Result<(Array, Array, Vec<i32>)> {
            let left = max_idx - c.idx;
            let rows = c.offsets.len() as i32;
            let (mut k, mut v) = match (&c.keys, &c.values) {
                (Some(k), Some(v)) => (k.clone(), v.clone()),
                _ => (zeros_dtype(&[rows, h, 0, dk], dtype)?, zeros_dtype(&[rows, h, 0, dv], dtype)?),
            };
            let mut right = width - k.dim(2) - left;
            if right < 0 {
                let keep = k.dim(2) + right;
                k = k.index((.., .., ..keep, ..));
                v = v.index((.., .., ..keep, ..));
                right = 0;
            }
            let lp = c.left_padding.iter().map(|p| p + left).collect();
            Ok((pad_both(&k, left, right)?, pad_both(&v, left, right)?, lp))
        };
        let (k1, v1, lp1) = pad(self)?;
        let (k2, v2, lp2) = pad(&other)?;
        self.keys = Some(concatenate(&[k1, k2], 0)?);
        self.values = Some(concatenate(&[v1, v2], 0)?);
        self.left_padding = lp1.into_iter().chain(lp2).collect();
        self.offsets.extend_from_slice(&other.offsets);
        self.idx = max_idx;
        self.written = self.written.max(other.written);
        Ok(())
    }

    /// Keeps rows `keep`; unlike the full-attention cache no shared padding is dropped (the
    /// ring's columns are positions in the ring, not in time).
    fn filter_rows(&mut self, keep: &[usize]) -> Result<()> {
        let idx: Vec<i32> = keep.iter().map(|&i| i as i32).collect();
        let idx_arr = Array::from_slice(&idx, &[idx.len() as i32]);
        if let (Some(k), Some(v)) = (&self.keys, &self.values) {
            self.keys = Some(k.take_axis(&idx_arr, 0)?);
            self.values = Some(v.take_axis(&idx_arr, 0)?);
        }
        self.left_padding = keep.iter().map(|&i| self.left_padding[i]).collect();
        self.offsets = keep.iter().map(|&i| self.offsets[i]).collect();
        Ok(())
    }

    /// mlx-lm `extract`: the row un-rotated into a single-sequence ring (keep = 0).
    fn extract_row(&self, row: usize) -> Result<Box<dyn KvCache>> {
        let (Some(k), Some(v)) = (&self.keys, &self.values) else {
            return Ok(Box::new(RotatingKvCache::new(self.max_size)));
        };
        let r = row as i32;
        let padding = self.left_padding[row].max(0);
        let (mut k, mut v) = (k.index((r..r + 1, .., .., ..)), v.index((r..r + 1, .., .., ..)));
        let mut end = self.idx;
        if self.rotated {
            let roll = |a: &Array| -> Result<Array> {
                Ok(concatenate(&[a.index((.., .., self.idx.., ..)), a.index((.., .., ..self.idx, ..))], 2)?)
            };
            k = roll(&k)?;
            v = roll(&v)?;
            end = self.max_size;
        }
        let end = end.min(k.dim(2));
        let k = k.index((.., .., padding..end, ..)).contiguous()?;
        let v = v.index((.., .., padding..end, ..)).contiguous()?;
        Ok(Box::new(RotatingKvCache::from_parts(k, v, self.offsets[row], self.max_size)))
    }
}

impl KvCache for BatchRotatingKvCache {
    super::faces!(attention, batch_rows);

    fn into_batched(self: Box<Self>) -> Result<Box<dyn KvCache>> {
        Ok(self)
    }

    /// Columns written into the ring so far (not per-row positions).
    fn len(&self) -> usize {
        self.written as usize
    }

    fn nbytes(&self) -> usize {
        self.keys.as_ref().map_or(0, |k| k.nbytes()) + self.values.as_ref().map_or(0, |v| v.nbytes())
    }

    fn state(&self) -> Vec<Array> {
        self.keys.iter().chain(self.values.iter()).cloned().collect()
    }

    /// Trimming is possible only before the ring wraps (mlx-lm `is_trimmable`).
    fn trim(&mut self, n: usize) -> usize {
        if n == 0 || self.written >= self.max_size {
            return 0;
        }
        let n = (n as i32).min(self.written);
        self.written -= n;
        self.idx -= n;
        for o in &mut self.offsets {
            *o -= n;
        }
        n as usize
    }

    fn duplicate(&self) -> Box<dyn KvCache> {
        Box::new(BatchRotatingKvCache {
            keys: self.keys.clone(),
            values: self.values.clone(),
            left_padding: self.left_padding.clone(),
            offsets: self.offsets.clone(),
            max_size: self.max_size,
            idx: self.idx,
            written: self.written,
            rotated: self.rotated,
        })
    }

    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any> {
        self
    }
}
