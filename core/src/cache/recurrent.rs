//! State caches of linear-attention layers (gated DeltaNet; mlx-lm `ArraysCache(size=2)`): a
//! causal-conv window `[B, K-1, C]` and a recurrent state `[B, Hv, Dv, Dk]` (float32). The
//! state summarizes every token seen, so unlike KV it cannot be trimmed: `trim` drops nothing
//! (returns 0) and the prompt cache reuses such entries only for exact prefixes.
//!
//! Rows are never padded: the engine prefills each row alone and batches rows only for
//! one-token decode steps, so no padding ever enters the state (mlx-lm masks it instead).

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{concatenate, zeros_dtype};
use mlx_rs::Array;

use super::{BatchRows, KvCache};
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
}

impl RecurrentState {
    fn with_rows(rows: usize) -> Self {
        RecurrentState { conv: None, ssm: None, lengths: vec![0; rows] }
    }

    /// Records that every row consumed `n` more tokens.
    pub fn advance(&mut self, n: i32) {
        for l in &mut self.lengths {
            *l += n;
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
}

impl KvCache for RecurrentCache {
    fn len(&self) -> usize {
        self.state.lengths[0] as usize
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
        };
        Ok(Box::new(RecurrentCache { state }))
    }
}

impl KvCache for BatchRecurrentCache {
    super::faces!(batch_rows);

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
    fn recurrent_state_cannot_be_trimmed() {
        let mut c = single(1.0, 7);
        assert_eq!(c.trim(2), 0);
        assert_eq!(c.len(), 7);
        // No attention face: an attention layer given this cache gets an error, not keys.
        assert!(c.attention().is_none());
        assert!(crate::cache::attention(c.as_mut()).is_err());
    }
}
