//! The batched full-attention KV cache (mlx-lm `BatchKVCache` semantics). Rows are left-padded
//! so they share one column index `idx`: row `b` holds real keys in columns
//! `left_padding[b]..idx`, its RoPE position is `idx - left_padding[b]`, and the mask is
//! causal ∧ `key >= left_padding[b]`.

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{concatenate, zeros_dtype};
use mlx_rs::Array;

use super::{left_padded_mask, write_columns, AttentionCache, AttentionMask, BatchRows, KvCache, KvCacheSingle, RightPadding, RopeOffset};
use crate::{Error, Result};

#[derive(Clone)]
pub struct BatchKvCache {
    /// `[B, H, capacity, D]`; columns `idx..` are free.
    keys: Option<Array>,
    values: Option<Array>,
    left_padding: Vec<i32>,
    idx: i32,
    /// Per-row right padding of the chunk being prefilled (set by `prepare_right_padding`,
    /// cleared by `finalize_padding`).
    right_padding: Option<Vec<i32>>,
}

impl BatchKvCache {
    /// A one-row batch holding a single sequence's cache.
    pub fn from_single(single: KvCacheSingle) -> Result<Self> {
        match single.keys_values() {
            Some((k, v)) => {
                let idx = k.dim(2);
                Ok(BatchKvCache { keys: Some(k), values: Some(v), left_padding: vec![0], idx, right_padding: None })
            }
            None => Ok(BatchKvCache { keys: None, values: None, left_padding: vec![0], idx: 0, right_padding: None }),
        }
    }

    pub fn left_padding(&self) -> &[i32] {
        &self.left_padding
    }

    /// The key and value storage, capacity included.
    pub fn storage(&self) -> Option<(Array, Array)> {
        Some((self.keys.clone()?, self.values.clone()?))
    }

    /// Pads `[B, H, T, D]` with zero columns: `left` before, up to `width` columns in total.
    fn pad_columns(a: &Array, left: i32, width: i32) -> Result<Array> {
        let (b, h, t, d) = (a.dim(0), a.dim(1), a.dim(2), a.dim(3));
        let mut parts = Vec::new();
        if left > 0 {
            parts.push(zeros_dtype(&[b, h, left, d], a.dtype())?);
        }
        parts.push(a.clone());
        let right = width - left - t;
        if right > 0 {
            parts.push(zeros_dtype(&[b, h, right, d], a.dtype())?);
        }
        Ok(if parts.len() == 1 { parts.pop().unwrap() } else { concatenate(&parts, 2)? })
    }
}

impl AttentionCache for BatchKvCache {
    fn rope_offset(&self) -> RopeOffset {
        let offsets: Vec<i32> = self.left_padding.iter().map(|lp| self.idx - lp).collect();
        RopeOffset::PerRow(Array::from_slice(&offsets, &[offsets.len() as i32]))
    }

    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        let written = write_columns(&mut self.keys, &mut self.values, self.idx, keys, values)?;
        self.idx += keys.dim(2);
        Ok(written)
    }

    /// `mask[b, 0, i, j] = j <= idx + i ∧ j >= left_padding[b]` (∧ `idx + i - j < window`).
    fn make_mask(&self, n: i32, window: Option<i32>) -> Result<AttentionMask> {
        Ok(AttentionMask::Array(left_padded_mask(self.idx, &self.left_padding, n, window)?))
    }
}

impl BatchRows for BatchKvCache {
    fn rows(&self) -> usize {
        self.left_padding.len()
    }

    /// Right-aligns both batches to the larger column index (left-padding the shorter). A side
    /// with nothing cached yet (a one-token prompt) becomes all padding.
    fn extend_rows(&mut self, other: Box<dyn KvCache>) -> Result<()> {
        let other = other
            .into_any()
            .downcast::<BatchKvCache>()
            .map_err(|_| Error::Unsupported("joining caches of different kinds".into()))?;
        let max_idx = self.idx.max(other.idx);
        let shape_of = |c: &BatchKvCache| c.keys.as_ref().zip(c.values.as_ref()).map(|(k, v)| (k.dim(1), k.dim(3), v.dim(3), k.dtype()));
        let Some((heads, dk, dv, dtype)) = shape_of(self).or_else(|| shape_of(&other)) else {
            // Neither side holds keys yet: only the row bookkeeping grows.
            self.left_padding.extend(other.left_padding.iter().copied());
            return Ok(());
        };
        let pad = |c: &BatchKvCache| -> Result<(Array, Array, Vec<i32>)> {
            let left = max_idx - c.idx;
            let lp: Vec<i32> = c.left_padding.iter().map(|p| p + left).collect();
            let rows = c.left_padding.len() as i32;
            Ok(match (&c.keys, &c.values) {
                (Some(k), Some(v)) => {
                    let k = k.index((.., .., ..c.idx, ..));
                    let v = v.index((.., .., ..c.idx, ..));
                    (Self::pad_columns(&k, left, max_idx)?, Self::pad_columns(&v, left, max_idx)?, lp)
                }
                _ => (
                    zeros_dtype(&[rows, heads, max_idx, dk], dtype)?,
                    zeros_dtype(&[rows, heads, max_idx, dv], dtype)?,
                    lp,
                ),
            })
        };
        let (k1, v1, lp1) = pad(self)?;
        let (k2, v2, lp2) = pad(&other)?;
        self.keys = Some(concatenate(&[k1, k2], 0)?);
        self.values = Some(concatenate(&[v1, v2], 0)?);
        self.left_padding = lp1.into_iter().chain(lp2).collect();
        self.idx = max_idx;
        Ok(())
    }

    /// Keeps `keep` rows, then drops the left-padding columns every remaining row shares.
    fn filter_rows(&mut self, keep: &[usize]) -> Result<()> {
        let idx: Vec<i32> = keep.iter().map(|&i| i as i32).collect();
        let idx_arr = Array::from_slice(&idx, &[idx.len() as i32]);
        self.left_padding = keep.iter().map(|&i| self.left_padding[i]).collect();
        if let (Some(k), Some(v)) = (&self.keys, &self.values) {
            self.keys = Some(k.take_axis(&idx_arr, 0)?);
            self.values = Some(v.take_axis(&idx_arr, 0)?);
        }
        let shared = self.left_padding.iter().copied().min().unwrap_or(0);
        if shared > 0 {
            if let (Some(k), Some(v)) = (&self.keys, &self.values) {
                self.keys = Some(k.index((.., .., shared.., ..)));
                self.values = Some(v.index((.., .., shared.., ..)));
            }
            self.idx -= shared;
            for p in &mut self.left_padding {
                *p -= shared;
            }
        }
        Ok(())
    }

    fn extract_row(&self, row: usize) -> Result<Box<dyn KvCache>> {
        let lp = self.left_padding[row];
        let r = row as i32;
        let (Some(k), Some(v)) = (&self.keys, &self.values) else {
            return Ok(Box::new(KvCacheSingle::new()));
        };
        let k = k.index((r..r + 1, .., lp..self.idx, ..)).contiguous()?;
        let v = v.index((r..r + 1, .., lp..self.idx, ..)).contiguous()?;
        Ok(Box::new(KvCacheSingle::from_keys_values(k, v)))
    }

    fn trims_rows(&self) -> bool {
        true
    }

    /// The positions every row drops leave through `idx`; a row dropping more has its columns
    /// rolled right by the difference (as [`RightPadding::finalize_padding`] does), the dropped
    /// ones going past `idx` and the wrapped capacity columns becoming masked left padding.
    fn trim_rows(&mut self, n: &[usize]) -> Result<()> {
        super::check_padding_rows(n.len(), self.left_padding.len())?;
        let shared = n.iter().copied().min().unwrap_or(0).min(self.idx as usize);
        self.idx -= shared as i32;
        let rest: Vec<i32> = n.iter().map(|&x| (x - shared) as i32).collect();
        if rest.iter().any(|&x| x > self.idx) {
            return Err(Error::Mlx(format!("trimming {n:?} positions from rows of a {}-column cache", self.idx + shared as i32)));
        }
        if rest.iter().any(|&x| x > 0) {
            self.right_padding = Some(rest);
            self.finalize_padding()?;
        }
        Ok(())
    }
}

impl RightPadding for BatchKvCache {
    /// Right padding needs no mask of its own: a row's padded tokens come after its real ones,
    /// so the causal mask already hides them from the real queries.
    fn prepare_right_padding(&mut self, right_padding: &[i32]) -> Result<()> {
        super::check_padding_rows(right_padding.len(), self.left_padding.len())?;
        self.right_padding = right_padding.iter().any(|&p| p > 0).then(|| right_padding.to_vec());
        Ok(())
    }

    /// mlx-lm `BatchKVCache.finalize`: rolls each row's columns (capacity included) right by
    /// its right padding, which then counts as left padding.
    fn finalize_padding(&mut self) -> Result<()> {
        let Some(rp) = self.right_padding.take() else { return Ok(()) };
        if let (Some(k), Some(v)) = (&self.keys, &self.values) {
            let (rows, n) = (rp.len() as i32, k.dim(2));
            let idx: Vec<i32> = rp.iter().flat_map(|&p| (0..n).map(move |j| (j - p).rem_euclid(n))).collect();
            let idx = Array::from_slice(&idx, &[rows, 1, n, 1]);
            self.keys = Some(k.take_along_axis(&idx, 2)?);
            self.values = Some(v.take_along_axis(&idx, 2)?);
        }
        for (lp, p) in self.left_padding.iter_mut().zip(rp) {
            *lp += p;
        }
        Ok(())
    }
}

impl KvCache for BatchKvCache {
    super::faces!(attention, batch_rows, right_padding);

    fn into_batched(self: Box<Self>) -> Result<Box<dyn KvCache>> {
        Ok(self)
    }

    fn len(&self) -> usize {
        self.idx as usize
    }

    fn nbytes(&self) -> usize {
        self.keys.as_ref().map_or(0, |k| k.nbytes()) + self.values.as_ref().map_or(0, |v| v.nbytes())
    }

    fn state(&self) -> Vec<Array> {
        self.keys.iter().chain(self.values.iter()).cloned().collect()
    }

    fn batched_prefill(&self) -> bool {
        true
    }

    fn trim(&mut self, n: usize) -> usize {
        let n = (n as i32).min(self.idx);
        self.idx -= n;
        n as usize
    }

    fn duplicate(&self) -> Box<dyn KvCache> {
        Box::new(BatchKvCache {
            keys: self.keys.clone(),
            values: self.values.clone(),
            left_padding: self.left_padding.clone(),
            idx: self.idx,
            right_padding: self.right_padding.clone(),
        })
    }

    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any> {
        self
    }
}
