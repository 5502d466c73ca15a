//! State caches of linear-attention layers (gated DeltaNet; mlx-lm `ArraysCache(size=2)`): a
//! causal-conv window `[B, K-1, C]` and a recurrent state `[B, Hv, Dv, Dk]` (float32). The
//! state summarizes every token seen, so unlike KV it cannot be trimmed: `trim` drops nothing
//! (returns 0) and the prompt cache reuses such entries only for exact prefixes.
//!
//! Rows prefill together as mlx-lm's `ArraysCache` lets them: a batched chunk is right-padded
//! ([`RightPadding`]), the layer masks the padded positions out of its conv input and keeps each
//! row's recurrent state unchanged over them, and takes each row's conv window at its own end,
//! so padding never enters a row's state and the row ends as it would alone.

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{concatenate, zeros_dtype};
use mlx_rs::Array;

use super::{BatchRows, KvCache, RightPadding};
use crate::{Error, Result};

/// The arrays a linear-attention layer reads and replaces each forward.
#[derive(Clone, Default)]
pub struct RecurrentState {
    /// The last `K-1` conv inputs, `[B, K-1, C]`; `None` before the first token.
    pub conv: Option<Array>,
    /// The recurrent state, `[B, Hv, Dv, Dk]` float32; `None` before the first token.
    pub ssm: Option<Array>,
    /// Tokens seen per row.
    lengths: Vec<i32>,
    /// Per-row right padding of the batched chunk being prefilled (mlx-lm `ArraysCache.lengths`
    /// as `n - right_padding`); `None` when no row is padded.
    right_padding: Option<Vec<i32>>,
}

impl RecurrentState {
    fn with_rows(rows: usize) -> Self {
        RecurrentState { conv: None, ssm: None, lengths: vec![0; rows], right_padding: None }
    }

    /// Each row's real tokens in a forward of `n` positions, when some row is right-padded
    /// (mlx-lm's `clip(lengths, 0, n)`); `None` when every row fills all `n`.
    pub fn chunk_lengths(&self, n: i32) -> Option<Vec<i32>> {
        self.right_padding.as_ref().map(|rp| rp.iter().map(|&p| (n - p).clamp(0, n)).collect())
    }

    /// `[B, n]` bool, true at each row's real positions (mlx-lm `ArraysCache.make_mask`), or
    /// `None` when no row is padded: what a linear-attention layer masks its inputs and state
    /// updates with.
    pub fn make_mask(&self, n: i32) -> Result<Option<Array>> {
        let Some(lengths) = self.chunk_lengths(n) else { return Ok(None) };
        let rows = lengths.len() as i32;
        let pos = Array::from_iter(0..n, &[1, n]);
        let lengths = Array::from_slice(&lengths, &[rows, 1]);
        Ok(Some(pos.lt(&lengths)?))
    }

    /// Records that every row consumed the real part of `n` more positions.
    pub fn advance(&mut self, n: i32) {
        let real = self.chunk_lengths(n);
        for (b, l) in self.lengths.iter_mut().enumerate() {
            *l += real.as_ref().map_or(n, |r| r[b]);
        }
    }

    pub fn rows(&self) -> usize {
        self.lengths.len()
    }

    fn nbytes(&self) -> usize {
        self.conv.as_ref().map_or(0, |a| a.nbytes()) + self.ssm.as_ref().map_or(0, |a| a.nbytes())
    }

    fn arrays(&self) -> Vec<Array> {
        self.conv.iter().chain(self.ssm.iter()).cloned().collect()
    }
}

/// One sequence's linear-attention state.
#[derive(Clone)]
pub struct RecurrentCache {
    state: RecurrentState,
}

impl Default for RecurrentCache {
    fn default() -> Self {
        RecurrentCache { state: RecurrentState::with_rows(1) }
    }
}

impl RecurrentCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// A state saved by [`KvCache::export`], `len` tokens seen.
    pub(crate) fn from_saved(conv: Option<Array>, ssm: Option<Array>, len: i32) -> Self {
        RecurrentCache { state: RecurrentState { conv, ssm, lengths: vec![len], right_padding: None } }
    }
}

impl KvCache for RecurrentCache {
    fn len(&self) -> usize {
        self.state.lengths[0] as usize
    }

    fn export(&self) -> Option<super::CacheParts> {
        let s = &self.state;
        let arrays = s.conv.iter().map(|a| ("conv".to_string(), a.clone())).chain(s.ssm.iter().map(|a| ("ssm".to_string(), a.clone())));
        Some(super::CacheParts { kind: "recurrent".into(), arrays: arrays.collect(), ints: vec![s.lengths[0] as i64] })
    }

    fn nbytes(&self) -> usize {
        self.state.nbytes()
    }

    fn state(&self) -> Vec<Array> {
        self.state.arrays()
    }

    fn into_batched(self: Box<Self>) -> Result<Box<dyn KvCache>> {
        Ok(Box::new(BatchRecurrentCache { state: self.state }))
    }

    fn batched_prefill(&self) -> bool {
        true
    }

    fn recurrent_state(&mut self) -> Option<&mut RecurrentState> {
        Some(&mut self.state)
    }

    fn duplicate(&self) -> Box<dyn KvCache> {
        Box::new(self.clone())
    }

    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any> {
        self
    }
}

/// Linear-attention state of a batch: row `b` of each array is row `b`'s own state.
#[derive(Clone)]
pub struct BatchRecurrentCache {
    state: RecurrentState,
}

impl BatchRecurrentCache {
    /// Concatenates `a` (`rows_a` rows) and `b` (`rows_b` rows) on the batch axis; a side
    /// with no state yet contributes zeros (the state a first token starts from).
    fn cat(a: Option<Array>, rows_a: usize, b: Option<Array>, rows_b: usize) -> Result<Option<Array>> {
        let zeros_like = |t: &Array, rows: usize| -> Result<Array> {
            let mut shape = t.shape().to_vec();
            shape[0] = rows as i32;
            Ok(zeros_dtype(&shape, t.dtype())?)
        };
        Ok(match (a, b) {
            (None, None) => None,
            (Some(a), Some(b)) => Some(concatenate(&[a, b], 0)?),
            (Some(a), None) => {
                let z = zeros_like(&a, rows_b)?;
                Some(concatenate(&[a, z], 0)?)
            }
            (None, Some(b)) => {
                let z = zeros_like(&b, rows_a)?;
                Some(concatenate(&[z, b], 0)?)
            }
        })
    }
}

impl BatchRows for BatchRecurrentCache {
    fn rows(&self) -> usize {
        self.state.rows()
    }

    fn extend_rows(&mut self, other: Box<dyn KvCache>) -> Result<()> {
        let other = other
            .into_any()
            .downcast::<BatchRecurrentCache>()
            .map_err(|_| Error::Unsupported("joining caches of different kinds".into()))?;
        if self.state.right_padding.is_some() || other.state.right_padding.is_some() {
            return Err(Error::Unsupported("rows join a recurrent cache only between padded chunks".into()));
        }
        let (ra, rb) = (self.state.rows(), other.state.rows());
        let s = &mut self.state;
        s.conv = Self::cat(s.conv.take(), ra, other.state.conv, rb)?;
        s.ssm = Self::cat(s.ssm.take(), ra, other.state.ssm, rb)?;
        s.lengths.extend(other.state.lengths);
        Ok(())
    }

    fn filter_rows(&mut self, keep: &[usize]) -> Result<()> {
        if let Some(&bad) = keep.iter().find(|&&i| i >= self.state.rows()) {
            return Err(Error::InvalidRequest(format!("row {bad} of a {}-row batch", self.state.rows())));
        }
        let idx: Vec<i32> = keep.iter().map(|&i| i as i32).collect();
        let idx = Array::from_slice(&idx, &[idx.len() as i32]);
        let s = &mut self.state;
        if let Some(c) = &s.conv {
            s.conv = Some(c.take_axis(&idx, 0)?);
        }
        if let Some(h) = &s.ssm {
            s.ssm = Some(h.take_axis(&idx, 0)?);
        }
        s.lengths = keep.iter().map(|&i| s.lengths[i]).collect();
        s.right_padding = s.right_padding.take().map(|rp| keep.iter().map(|&i| rp[i]).collect());
        Ok(())
    }

    fn extract_row(&self, row: usize) -> Result<Box<dyn KvCache>> {
        if row >= self.state.rows() {
            return Err(Error::InvalidRequest(format!("row {row} of a {}-row batch", self.state.rows())));
        }
        let r = row as i32;
        let take = |a: &Option<Array>| -> Result<Option<Array>> {
            a.as_ref().map(|a| a.index(r..r + 1).contiguous().map_err(Error::from)).transpose()
        };
        let state = RecurrentState {
            conv: take(&self.state.conv)?,
            ssm: take(&self.state.ssm)?,
            lengths: vec![self.state.lengths[row]],
            right_padding: None,
        };
        Ok(Box::new(RecurrentCache { state }))
    }
}

impl RightPadding for BatchRecurrentCache {
    fn prepare_right_padding(&mut self, right_padding: &[i32]) -> Result<()> {
        super::check_padding_rows(right_padding.len(), self.state.rows())?;
        self.state.right_padding = right_padding.iter().any(|&p| p > 0).then(|| right_padding.to_vec());
        Ok(())
    }

    /// Nothing moves: each row's state already ends at its last real token (mlx-lm's
    /// `ArraysCache.finalize` only forgets the lengths).
    fn finalize_padding(&mut self) -> Result<()> {
        self.state.right_padding = None;
        Ok(())
    }
}

impl KvCache for BatchRecurrentCache {
    super::faces!(batch_rows, right_padding);

    fn batched_prefill(&self) -> bool {
        true
    }

    fn into_batched(self: Box<Self>) -> Result<Box<dyn KvCache>> {
        Ok(self)
    }

    /// The longest row (rows are not aligned; each row's own count is in `extract_row`).
    fn len(&self) -> usize {
        self.state.lengths.iter().copied().max().unwrap_or(0) as usize
    }

    fn nbytes(&self) -> usize {
        self.state.nbytes()
    }

    fn state(&self) -> Vec<Array> {
        self.state.arrays()
    }

    fn recurrent_state(&mut self) -> Option<&mut RecurrentState> {
        Some(&mut self.state)
    }

    fn duplicate(&self) -> Box<dyn KvCache> {
        Box::new(self.clone())
    }

    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any> {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn single(value: f32, len: i32) -> Box<dyn KvCache> {
        let mut c = RecurrentCache::new();
        c.state.conv = Some(Array::from_slice(&[value; 6], &[1, 3, 2]));
        c.state.ssm = Some(Array::from_slice(&[value * 10.0; 4], &[1, 1, 2, 2]));
        c.state.lengths = vec![len];
        Box::new(c)
    }

    fn values(a: &Array) -> Vec<f32> {
        a.eval().unwrap();
        a.as_slice::<f32>().to_vec()
    }

    #[test]
    fn rows_join_filter_and_extract_with_their_own_state() {
        let mut batched = single(1.0, 5).into_batched().unwrap();
        let batch = batched.batch_rows().unwrap();
        // A one-token prompt joins with no state yet: it starts from zeros.
        batch.extend_rows(Box::new(RecurrentCache::new()).into_batched().unwrap()).unwrap();
        batch.extend_rows(single(3.0, 9).into_batched().unwrap()).unwrap();
        assert_eq!(batch.rows(), 3);
        let row1 = batch.extract_row(1).unwrap();
        assert_eq!(row1.len(), 0);
        let mut row1 = row1;
        assert_eq!(values(row1.recurrent_state().unwrap().conv.as_ref().unwrap()), vec![0.0; 6]);
        batch.filter_rows(&[2, 0]).unwrap();
        let mut first = batch.extract_row(0).unwrap();
        assert_eq!(first.len(), 9);
        assert_eq!(values(first.recurrent_state().unwrap().ssm.as_ref().unwrap()), vec![30.0; 4]);
        let mut second = batch.extract_row(1).unwrap();
        assert_eq!(second.len(), 5);
        assert_eq!(values(second.recurrent_state().unwrap().conv.as_ref().unwrap()), vec![1.0; 6]);
        assert!(batch.extract_row(2).is_err());
    }

    #[test]
    fn right_padded_chunks_mask_each_row_and_count_its_real_tokens() {
        let mut batched = single(1.0, 5).into_batched().unwrap();
        batched.batch_rows().unwrap().extend_rows(Box::new(RecurrentCache::new()).into_batched().unwrap()).unwrap();
        // Equal chunks: no mask, as in a decode step.
        batched.right_padding().unwrap().prepare_right_padding(&[0, 0]).unwrap();
        assert!(batched.recurrent_state().unwrap().make_mask(4).unwrap().is_none());
        assert!(batched.right_padding().unwrap().prepare_right_padding(&[1]).is_err());

        batched.right_padding().unwrap().prepare_right_padding(&[0, 3]).unwrap();
        let state = batched.recurrent_state().unwrap();
        assert_eq!(state.chunk_lengths(4), Some(vec![4, 1]));
        let mask = state.make_mask(4).unwrap().unwrap();
        mask.eval().unwrap();
        assert_eq!(mask.shape(), &[2, 4]);
        assert_eq!(mask.as_slice::<bool>(), &[true, true, true, true, true, false, false, false]);
        state.advance(4);
        // Rows join only between chunks.
        let joiner = Box::new(RecurrentCache::new()).into_batched().unwrap();
        assert!(batched.batch_rows().unwrap().extend_rows(joiner).is_err());
        batched.right_padding().unwrap().finalize_padding().unwrap();
        assert!(batched.recurrent_state().unwrap().make_mask(4).unwrap().is_none());
        let rows = batched.batch_rows().unwrap();
        assert_eq!(rows.extract_row(0).unwrap().len(), 9);
        assert_eq!(rows.extract_row(1).unwrap().len(), 1);
    }

    #[test]
    fn recurrent_state_cannot_be_trimmed() {
        let mut c = single(1.0, 7);
        assert_eq!(c.trim(2), 0);
        assert_eq!(c.len(), 7);
        // No attention face: an attention layer given this cache gets an error, not keys.
        assert!(c.attention().is_none());
        assert!(crate::cache::attention(c.as_mut()).is_err());
    }
}
