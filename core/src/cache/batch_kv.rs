//! The batched full-attention KV cache (mlx-lm `BatchKVCache` semantics). Rows are left-padded
//! so they share one column index `idx`: row `b` holds real keys in columns
//! `left_padding[b]..idx`, its RoPE position is `idx - left_padding[b]`, and the mask is
//! causal ∧ `key >= left_padding[b]`.
//!
//! Speculative decoding drops a row's rejected draft positions as *holes*: column ranges the
//! row's mask hides and its RoPE position does not count, so rows that accept different
//! numbers of draft tokens move no data. Holes are compacted away (one gather) only once a
//! row's reach [`COMPACT_HOLES`] columns.

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{concatenate, zeros_dtype};
use mlx_rs::Array;

use super::{left_padded_mask, write_columns, AttentionCache, AttentionMask, BatchRows, KvCache, KvCacheSingle, RightPadding, RopeOffset};
use crate::{Error, Result};

/// Hole columns a row may gather before the cache compacts (bounds the masked waste at
/// about one capacity step).
const COMPACT_HOLES: i32 = 256;

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
    /// Per row, sorted disjoint `[start, end)` column ranges in `left_padding[b]..idx` that hold
    /// dropped positions (see the module doc).
    holes: Vec<Vec<(i32, i32)>>,
}

impl BatchKvCache {
    /// A one-row batch holding a single sequence's cache.
    pub fn from_single(single: KvCacheSingle) -> Result<Self> {
        match single.keys_values() {
            Some((k, v)) => {
                let idx = k.dim(2);
                Ok(BatchKvCache { keys: Some(k), values: Some(v), left_padding: vec![0], idx, right_padding: None, holes: vec![Vec::new()] })
            }
            None => Ok(BatchKvCache {
                keys: None,
                values: None,
                left_padding: vec![0],
                idx: 0,
                right_padding: None,
                holes: vec![Vec::new()],
            }),
        }
    }

    pub fn left_padding(&self) -> &[i32] {
        &self.left_padding
    }

    /// The key and value storage, capacity included.
    pub fn storage(&self) -> Option<(Array, Array)> {
        Some((self.keys.clone()?, self.values.clone()?))
    }

    fn hole_count(&self, row: usize) -> i32 {
        self.holes[row].iter().map(|(s, e)| e - s).sum()
    }

    /// Row `row`'s real columns (`left_padding..idx` less its holes), in order.
    fn real_columns(&self, row: usize) -> Vec<i32> {
        let holes = &self.holes[row];
        (self.left_padding[row]..self.idx).filter(|j| !holes.iter().any(|(s, e)| (s..e).contains(&j))).collect()
    }

    /// Moves every row's real columns right-aligned against `idx` (one gather), so no holes
    /// remain, then drops the left-padding columns all rows share.
    fn compact(&mut self) -> Result<()> {
        if self.holes.iter().all(Vec::is_empty) {
            return Ok(());
        }
        let real: Vec<Vec<i32>> = (0..self.rows()).map(|b| self.real_columns(b)).collect();
        if let (Some(k), Some(v)) = (&self.keys, &self.values) {
            let n = k.dim(2);
            let mut idx = Vec::with_capacity(real.len() * n as usize);
            for cols in &real {
                let start = self.idx - cols.len() as i32;
                // Columns before `start` become masked padding (their content is irrelevant).
                idx.extend((0..n).map(|j| if j >= start && j < self.idx { cols[(j - start) as usize] } else { j }));
            }
            let idx = Array::from_slice(&idx, &[real.len() as i32, 1, n, 1]);
            self.keys = Some(k.take_along_axis(&idx, 2)?);
            self.values = Some(v.take_along_axis(&idx, 2)?);
        }
        for (b, cols) in real.iter().enumerate() {
            self.left_padding[b] = self.idx - cols.len() as i32;
            self.holes[b].clear();
        }
        self.drop_shared_padding();
        Ok(())
    }

    /// Drops the left-padding columns every row shares.
    fn drop_shared_padding(&mut self) {
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
            for h in self.holes.iter_mut().flatten() {
                *h = (h.0 - shared, h.1 - shared);
            }
        }
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
        let offsets: Vec<i32> =
            self.left_padding.iter().enumerate().map(|(b, lp)| self.idx - lp - self.hole_count(b)).collect();
        RopeOffset::PerRow(Array::from_slice(&offsets, &[offsets.len() as i32]))
    }

    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        let written = write_columns(&mut self.keys, &mut self.values, self.idx, keys, values)?;
        self.idx += keys.dim(2);
        Ok(written)
    }

    /// `mask[b, 0, i, j] = j <= idx + i ∧ j >= left_padding[b]` (∧ `idx + i - j < window`),
    /// ∧ `j` outside row `b`'s holes. (A window would count hole columns: speculation is off
    /// for sliding-window models.)
    fn make_mask(&self, n: i32, window: Option<i32>) -> Result<AttentionMask> {
        let mask = left_padded_mask(self.idx, &self.left_padding, n, window)?;
        if self.holes.iter().all(Vec::is_empty) {
            return Ok(AttentionMask::Array(mask));
        }
        let total = self.idx + n;
        let mut open = vec![true; self.holes.len() * total as usize];
        for (b, holes) in self.holes.iter().enumerate() {
            for &(s, e) in holes {
                open[b * total as usize + s as usize..b * total as usize + e as usize].fill(false);
            }
        }
        let open = Array::from_slice(&open, &[self.holes.len() as i32, 1, 1, total]);
        Ok(AttentionMask::Array(mask.logical_and(&open)?))
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
            self.holes.extend(other.holes.iter().cloned());
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
        let shifted = |c: &BatchKvCache| -> Vec<Vec<(i32, i32)>> {
            let left = max_idx - c.idx;
            c.holes.iter().map(|h| h.iter().map(|(s, e)| (s + left, e + left)).collect()).collect()
        };
        let holes: Vec<Vec<(i32, i32)>> = shifted(self).into_iter().chain(shifted(&other)).collect();
        let (k1, v1, lp1) = pad(self)?;
        let (k2, v2, lp2) = pad(&other)?;
        self.holes = holes;
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
        self.holes = keep.iter().map(|&i| self.holes[i].clone()).collect();
        if let (Some(k), Some(v)) = (&self.keys, &self.values) {
            self.keys = Some(k.take_axis(&idx_arr, 0)?);
            self.values = Some(v.take_axis(&idx_arr, 0)?);
        }
        self.drop_shared_padding();
        Ok(())
    }

    fn extract_row(&self, row: usize) -> Result<Box<dyn KvCache>> {
        let lp = self.left_padding[row];
        let r = row as i32;
        let (Some(k), Some(v)) = (&self.keys, &self.values) else {
            return Ok(Box::new(KvCacheSingle::new()));
        };
        let (k, v) = (k.index((r..r + 1, .., lp..self.idx, ..)), v.index((r..r + 1, .., lp..self.idx, ..)));
        let (k, v) = match self.holes[row].is_empty() {
            true => (k, v),
            false => {
                let cols: Vec<i32> = self.real_columns(row).iter().map(|j| j - lp).collect();
                let cols = Array::from_slice(&cols, &[cols.len() as i32]);
                (k.take_axis(&cols, 2)?, v.take_axis(&cols, 2)?)
            }
        };
        Ok(Box::new(KvCacheSingle::from_keys_values(k.contiguous()?, v.contiguous()?)))
    }

    /// A lone row without left padding or holes hands its storage over (the history is not
    /// copied; the spare capacity goes with it).
    fn take_only_row(&mut self) -> Result<Box<dyn KvCache>> {
        if self.rows() == 1 && self.left_padding[0] == 0 && self.holes[0].is_empty() {
            if let (Some(k), Some(v)) = (self.keys.take(), self.values.take()) {
                return Ok(Box::new(KvCacheSingle::from_storage(k, v, self.idx)));
            }
        }
        self.extract_row(0)
    }

    fn trims_rows(&self) -> bool {
        true
    }

    /// The positions every row drops leave through `idx`; a row dropping more keeps the
    /// difference as a hole (masked, not counted in its RoPE position): no data moves.
    fn trim_rows(&mut self, n: &[usize]) -> Result<()> {
        super::check_padding_rows(n.len(), self.left_padding.len())?;
        let shared = n.iter().copied().min().unwrap_or(0).min(self.idx as usize);
        let rest: Vec<i32> = n.iter().map(|&x| (x - shared) as i32).collect();
        let end = self.idx - shared as i32;
        for (b, &r) in rest.iter().enumerate() {
            // The holes may only cover columns the row has written since its last hole.
            let floor = self.holes[b].last().map_or(self.left_padding[b], |h| h.1);
            if end - r < floor {
                return Err(Error::Mlx(format!("trimming {n:?} positions from rows of a {}-column cache", self.idx)));
            }
        }
        self.idx = end;
        for (b, &r) in rest.iter().enumerate() {
            for h in &mut self.holes[b] {
                h.1 = h.1.min(end);
            }
            self.holes[b].retain(|(s, e)| s < e);
            if r > 0 {
                match self.holes[b].last_mut() {
                    Some(last) if last.1 == end - r => last.1 = end,
                    _ => self.holes[b].push((end - r, end)),
                }
            }
        }
        if (0..self.rows()).any(|b| self.hole_count(b) >= COMPACT_HOLES) {
            self.compact()?;
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
        for ((lp, holes), p) in self.left_padding.iter_mut().zip(&mut self.holes).zip(rp) {
            *lp += p;
            for h in holes.iter_mut() {
                *h = (h.0 + p, h.1 + p);
            }
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
        for holes in &mut self.holes {
            for h in holes.iter_mut() {
                h.1 = h.1.min(self.idx);
            }
            holes.retain(|(s, e)| s < e);
        }
        n as usize
    }

    fn duplicate(&self) -> Box<dyn KvCache> {
        Box::new(BatchKvCache {
            keys: self.keys.clone(),
            values: self.values.clone(),
            left_padding: self.left_padding.clone(),
            idx: self.idx,
            right_padding: self.right_padding.clone(),
            holes: self.holes.clone(),
        })
    }

    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any> {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `[rows, 1, n, 1]` keys whose value names the row and the position: `100 * row + start + i`.
    fn cols(rows: i32, start: i32, n: i32) -> Array {
        let v: Vec<f32> = (0..rows).flat_map(|b| (0..n).map(move |i| (100 * b + start + i) as f32)).collect();
        Array::from_slice(&v, &[rows, 1, n, 1])
    }

    fn row(c: &BatchKvCache, b: usize) -> Vec<f32> {
        let single = c.extract_row(b).unwrap();
        let (k, _) = single.into_any().downcast::<KvCacheSingle>().unwrap().keys_values().unwrap();
        k.eval().unwrap();
        k.as_slice::<f32>().to_vec()
    }

    fn offsets(c: &BatchKvCache) -> Vec<i32> {
        match c.rope_offset() {
            RopeOffset::PerRow(a) => {
                a.eval().unwrap();
                a.as_slice::<i32>().to_vec()
            }
            RopeOffset::Scalar(_) => unreachable!(),
        }
    }

    /// Rows trimmed by different counts keep exactly their kept positions (holes, no shift):
    /// the next write follows each row's kept prefix in its RoPE position, the mask hides the
    /// dropped columns, and the holes go when they grow past the compaction bound.
    #[test]
    fn rows_trimmed_unequally_keep_their_prefixes() {
        let mut c = BatchKvCache::from_single(KvCacheSingle::new()).unwrap();
        c.extend_rows(Box::new(BatchKvCache::from_single(KvCacheSingle::new()).unwrap())).unwrap();
        c.update_and_fetch(&cols(2, 0, 5), &cols(2, 0, 5)).unwrap();
        // Row 0 drops 1 position, row 1 drops 3: one shared column leaves, row 1 keeps a 2-hole.
        c.trim_rows(&[1, 3]).unwrap();
        assert_eq!((c.idx, offsets(&c)), (4, vec![4, 2]));
        assert_eq!(row(&c, 0), [0.0, 1.0, 2.0, 3.0]);
        assert_eq!(row(&c, 1), [100.0, 101.0]);
        let AttentionMask::Array(m) = c.make_mask(1, None).unwrap() else { panic!() };
        m.eval().unwrap();
        assert_eq!(m.as_slice::<bool>(), [true, true, true, true, true, true, true, false, false, true]);
        c.update_and_fetch(&cols(2, 50, 3), &cols(2, 50, 3)).unwrap();
        c.trim_rows(&[2, 0]).unwrap();
        assert_eq!(row(&c, 0), [0.0, 1.0, 2.0, 3.0, 50.0]);
        assert_eq!(row(&c, 1), [100.0, 101.0, 150.0, 151.0, 152.0]);
        assert_eq!(offsets(&c), vec![5, 5]);
        // Filtering keeps each remaining row's holes with it.
        let mut d = c.duplicate().into_any().downcast::<BatchKvCache>().unwrap();
        d.filter_rows(&[0]).unwrap();
        assert_eq!((row(&d, 0), offsets(&d)), (vec![0.0, 1.0, 2.0, 3.0, 50.0], vec![5]));
        // Past the bound the holes are gathered away: the same rows, no hole columns left.
        c.update_and_fetch(&cols(2, 200, 300), &cols(2, 200, 300)).unwrap();
        c.trim_rows(&[0, COMPACT_HOLES as usize]).unwrap();
        assert!(c.holes.iter().all(Vec::is_empty));
        let r0 = row(&c, 0);
        let r1 = row(&c, 1);
        assert_eq!((r0.len(), r1.len()), (305, 305 - COMPACT_HOLES as usize));
        assert_eq!(&r1[..5], [100.0, 101.0, 150.0, 151.0, 152.0]);
        assert_eq!(*r1.last().unwrap(), (100 + 200 + 300 - 1 - COMPACT_HOLES) as f32);
        assert_eq!(offsets(&c), vec![305, 305 - COMPACT_HOLES]);
        assert_eq!(c.idx, 305);
    }

    /// A lone row leaving hands its storage over (no copy): the same positions as an
    /// extraction, and the spare capacity goes along for the next write.
    #[test]
    fn a_lone_row_takes_the_storage_whole() {
        let mut c = BatchKvCache::from_single(KvCacheSingle::new()).unwrap();
        c.update_and_fetch(&cols(1, 0, 5), &cols(1, 0, 5)).unwrap();
        let want = row(&c, 0);
        let capacity = c.keys.as_ref().unwrap().dim(2);
        assert!(capacity > 5);
        let mut taken = c.take_only_row().unwrap().into_any().downcast::<KvCacheSingle>().unwrap();
        assert_eq!(taken.len(), 5);
        let (k, _) = taken.storage().unwrap();
        assert_eq!(k.dim(2), capacity, "the storage itself, not a copy of its rows");
        let (k, _) = taken.keys_values().unwrap();
        k.eval().unwrap();
        assert_eq!(k.as_slice::<f32>(), want);
        taken.update_and_fetch(&cols(1, 5, 2), &cols(1, 5, 2)).unwrap();
        let (k, _) = taken.keys_values().unwrap();
        k.eval().unwrap();
        assert_eq!(k.as_slice::<f32>(), [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        // Rows with left padding are extracted as before.
        let mut two = BatchKvCache::from_single(KvCacheSingle::new()).unwrap();
        two.extend_rows(Box::new(BatchKvCache::from_single(KvCacheSingle::new()).unwrap())).unwrap();
        two.update_and_fetch(&cols(2, 0, 3), &cols(2, 0, 3)).unwrap();
        two.filter_rows(&[1]).unwrap();
        let taken = two.take_only_row().unwrap();
        assert_eq!(taken.len(), 3);
    }
}
