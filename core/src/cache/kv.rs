//! The single-sequence full-attention KV cache (mlx-lm `KVCache`): storage grows in 256-slot
//! steps and new keys are written in place, so a decode step copies one slot, not the history.

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;

use super::{causal_mask, write_columns, AttentionCache, AttentionMask, BatchKvCache, KvCache, RopeOffset};
use crate::Result;

#[derive(Default, Clone)]
pub struct KvCacheSingle {
    keys: Option<Array>,
    values: Option<Array>,
    offset: i32,
}

impl KvCacheSingle {
    pub fn new() -> Self {
        Self::default()
    }

    /// The cached keys and values (`[B, H, len, D]`), if any.
    pub fn keys_values(&self) -> Option<(Array, Array)> {
        let (k, v) = (self.keys.as_ref()?, self.values.as_ref()?);
        Some((k.index((.., .., ..self.offset, ..)), v.index((.., .., ..self.offset, ..))))
    }

    /// The key and value storage, capacity included (what mlx-lm's `to_quantized` quantizes).
    pub fn storage(&self) -> Option<(Array, Array)> {
        Some((self.keys.clone()?, self.values.clone()?))
    }

    /// A cache whose first `offset` columns of this storage (capacity beyond them included)
    /// are its keys and values: a batch's storage handed over whole, without a copy.
    pub(crate) fn from_storage(keys: Array, values: Array, offset: i32) -> Self {
        KvCacheSingle { keys: Some(keys), values: Some(values), offset }
    }

    /// A cache holding exactly these `[B, H, len, D]` keys and values.
    pub fn from_keys_values(keys: Array, values: Array) -> Self {
        let offset = keys.dim(2);
        KvCacheSingle { keys: Some(keys), values: Some(values), offset }
    }
}

impl AttentionCache for KvCacheSingle {
    fn rope_offset(&self) -> RopeOffset {
        RopeOffset::Scalar(self.offset)
    }

    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        let written = write_columns(&mut self.keys, &mut self.values, self.offset, keys, values)?;
        self.offset += keys.dim(2);
        Ok(written)
    }

    fn make_mask(&self, n: i32, window: Option<i32>) -> Result<AttentionMask> {
        Ok(match window {
            Some(w) => AttentionMask::Array(causal_mask(n, self.offset, Some(w))?),
            None if n == 1 => AttentionMask::None,
            None => AttentionMask::Causal,
        })
    }
}

impl KvCache for KvCacheSingle {
    super::faces!(attention);

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
        Ok(Box::new(BatchKvCache::from_single(*self)?))
    }

    fn batched_prefill(&self) -> bool {
        true
    }

    fn always_trims(&self) -> bool {
        true
    }

    fn export(&self) -> Option<super::CacheParts> {
        let (keys, values) = self.keys_values()?;
        Some(super::CacheParts { kind: "kv".into(), arrays: vec![("keys".into(), keys), ("values".into(), values)], ints: Vec::new() })
    }

    /// Drops the last `n` positions (the storage is kept and overwritten later).
    fn trim(&mut self, n: usize) -> usize {
        let n = (n as i32).min(self.offset);
        self.offset -= n;
        n as usize
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

    fn seq(start: i32, n: i32) -> Array {
        Array::from_iter((start..start + n).map(|x| x as f32), &[1, 1, n, 1])
    }

    #[test]
    fn writes_after_a_trim_land_after_the_kept_prefix() {
        let mut c = KvCacheSingle::new();
        c.update_and_fetch(&seq(0, 10), &seq(0, 10)).unwrap();
        let mut d = c.duplicate();
        d.trim(7);
        let (k, _) = d.attention().unwrap().update_and_fetch(&seq(100, 4), &seq(100, 4)).unwrap();
        k.eval().unwrap();
        assert_eq!(k.as_slice::<f32>(), &[0.0, 1.0, 2.0, 100.0, 101.0, 102.0, 103.0]);
        // The original is untouched.
        let (k0, _) = c.keys_values().unwrap();
        k0.eval().unwrap();
        assert_eq!(k0.as_slice::<f32>(), &(0..10).map(|x| x as f32).collect::<Vec<_>>()[..]);
    }
}
