//! Affine-quantized KV caches: mlx-lm's `QuantizedKVCache` for one sequence, and a batched form
//! mlx-lm does not have (its `QuantizedKVCache` cannot merge), laid out like [`BatchKvCache`]:
//! left-padded rows sharing one column index.
//!
//! Keys and values are stored as `mx.quantize` triples (packed uint32 weights, scales, biases)
//! per position, so a position's quantization never depends on its neighbours: a row quantizes
//! identically alone or in a batch. Attention runs on the packed form
//! ([`quantized_sdpa`], mlx-lm's `quantized_scaled_dot_product_attention`).
//!
//! Caches start in full precision and convert themselves once they hold `start` positions
//! ([`QuantizingKvCache`], made by [`quantizing`]): mlx-lm's `maybe_quantize_kv_cache`, which
//! runs after every forward, here inside the cache after the layer's one update per forward.

use mlx_rs::ops::indexing::{IndexOp, TryIndexMutOp};
use mlx_rs::ops::{concatenate, dequantize, quantize, quantized_matmul, softmax_axis, zeros_dtype};
use mlx_rs::{Array, Dtype};

use super::{
    causal_mask, left_padded_mask, AttentionCache, AttentionMask, BatchKvCache, BatchRows, KvCache, KvCacheSingle, RopeOffset,
};
use crate::{Error, Result};

/// KV-cache quantization settings (mlx-lm's `kv_bits`, `kv_group_size`, `quantized_kv_start`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvQuantization {
    pub bits: i32,
    pub group_size: i32,
    /// Caches convert once they hold this many positions (0 = after the first forward).
    pub start: usize,
}

impl KvQuantization {
    pub const DEFAULT_GROUP_SIZE: i32 = 64;

    /// Settings from optional `kv_bits` (None = full precision).
    pub fn from_options(bits: Option<i32>, group_size: i32, start: usize) -> Option<Self> {
        bits.map(|bits| KvQuantization { bits, group_size, start })
    }

    /// Checks the settings MLX's affine quantization accepts, and that heads of `head_dim`
    /// split into whole groups.
    pub fn validate(&self, head_dim: Option<i32>) -> Result<()> {
        if ![2, 3, 4, 5, 6, 8].contains(&self.bits) {
            return Err(Error::InvalidRequest(format!("kv_bits must be 2, 3, 4, 5, 6 or 8, got {}", self.bits)));
        }
        if ![32, 64, 128].contains(&self.group_size) {
            return Err(Error::InvalidRequest(format!("kv_group_size must be 32, 64 or 128, got {}", self.group_size)));
        }
        if let Some(d) = head_dim {
            if d % self.group_size != 0 {
                return Err(Error::InvalidRequest(format!(
                    "kv_group_size {} does not divide the model's head_dim {d}; choose a group size that divides it",
                    self.group_size
                )));
            }
        }
        Ok(())
    }

    /// Bytes of one quantized `[.., dim]` vector: packed weights plus a scale and a bias per group.
    pub fn vector_bytes(&self, dim: i32, scale_bytes: usize) -> usize {
        (dim * self.bits / 8) as usize + 2 * (dim / self.group_size) as usize * scale_bytes
    }
}

/// Packed weights, scales, biases (`mx.quantize`'s outputs) of `[B, H, T, D]` keys or values.
pub type Quantized = [Array; 3];

fn quantize_kv(x: &Array, group_size: i32, bits: i32) -> Result<Quantized> {
    let (w, s, b) = quantize(x, group_size, bits)?;
    Ok([w, s, b])
}

fn dequantize_kv(q: &Quantized, group_size: i32, bits: i32) -> Result<Array> {
    Ok(dequantize(&q[0], &q[1], &q[2], group_size, bits)?)
}

fn slice_cols(q: &Quantized, range: std::ops::Range<i32>) -> Quantized {
    q.clone().map(|a| a.index((.., .., range.clone(), ..)))
}

/// Writes quantized `[B, H, L, *]` triples at column `at` of growable storage (256-column
/// steps, in place, like mlx-lm's `QuantizedKVCache`); returns the filled columns `..at + L`.
fn write_quantized(buf: &mut Option<Quantized>, at: i32, new: &Quantized) -> Result<Quantized> {
    const STEP: i32 = 256;
    let n = new[0].dim(2);
    let capacity = buf.as_ref().map_or(0, |q| q[0].dim(2));
    if buf.is_none() || at + n > capacity {
        let steps = (STEP + n - 1) / STEP * STEP;
        let grown: Vec<Array> = new
            .iter()
            .enumerate()
            .map(|(i, a)| {
                let fresh = zeros_dtype(&[a.dim(0), a.dim(1), steps, a.dim(3)], a.dtype())?;
                Ok(match buf.as_ref() {
                    Some(old) => {
                        let old = if at % STEP != 0 { old[i].index((.., .., ..at, ..)) } else { old[i].clone() };
                        concatenate(&[old, fresh], 2)?
                    }
                    None => fresh,
                })
            })
            .collect::<Result<_>>()?;
        *buf = Some(grown.try_into().map_err(|_| Error::Mlx("quantized cache parts".into()))?);
    }
    let end = at + n;
    let q = buf.as_mut().unwrap();
    for (dst, src) in q.iter_mut().zip(new) {
        dst.try_index_mut((.., .., at..end, ..), src)?;
    }
    Ok(if end < q[0].dim(2) { slice_cols(q, 0..end) } else { q.clone() })
}

/// The lowest finite value of a float dtype (`mx.finfo(dtype).min`).
fn finfo_min(dtype: Dtype) -> f32 {
    match dtype {
        Dtype::Float16 => -65504.0,
        Dtype::Bfloat16 => f32::from_bits(0xff7f_0000),
        _ => f32::MIN,
    }
}

/// mlx-lm's `quantized_scaled_dot_product_attention`, op for op: scaled queries against the
/// packed keys (grouped-query heads folded into a repeat axis), boolean mask by `where` with the
/// dtype's lowest value, precise softmax, scores against the packed values.
pub fn quantized_sdpa(
    queries: &Array,
    keys: &Quantized,
    values: &Quantized,
    scale: f32,
    mask: &AttentionMask,
    group_size: i32,
    bits: i32,
) -> Result<Array> {
    let (b, n_q, l, d) = (queries.dim(0), queries.dim(1), queries.dim(2), queries.dim(3));
    let n_kv = keys[0].dim(-3);
    let repeats = n_q / n_kv;
    let dtype = queries.dtype();
    let mut q = queries.multiply(Array::from_f32(scale).as_dtype(dtype)?)?;
    let (k, v) = if repeats > 1 {
        q = q.reshape(&[b, n_kv, repeats, l, d])?;
        let expand = |t: &Quantized| -> Result<Quantized> {
            Ok([t[0].expand_dims(-3)?, t[1].expand_dims(-3)?, t[2].expand_dims(-3)?])
        };
        (expand(keys)?, expand(values)?)
    } else {
        (keys.clone(), values.clone())
    };
    let mut scores = quantized_matmul(&q, &k[0], &k[1], &k[2], true, group_size, bits)?;
    let mask = match mask {
        AttentionMask::None => None,
        AttentionMask::Causal => {
            let (ql, kl) = (scores.dim(-2), scores.dim(-1));
            Some(causal_mask(ql, kl - ql, None)?)
        }
        AttentionMask::Array(m) if repeats > 1 && m.ndim() > 3 => Some(m.expand_dims(-3)?),
        AttentionMask::Array(m) => Some(m.clone()),
    };
    if let Some(m) = mask {
        scores = if m.dtype() == Dtype::Bool {
            let low = Array::from_f32(finfo_min(scores.dtype())).as_dtype(scores.dtype())?;
            mlx_rs::ops::select(&m, &scores, &low)?
        } else {
            scores.add(&m)?
        };
    }
    let scores = softmax_axis(&scores, -1, true)?;
    let out = quantized_matmul(&scores, &v[0], &v[1], &v[2], false, group_size, bits)?;
    Ok(if repeats > 1 { out.reshape(&[b, n_q, l, d])? } else { out })
}

fn nbytes(q: &Option<Quantized>) -> usize {
    q.iter().flatten().map(|a| a.nbytes()).sum()
}

fn state(k: &Option<Quantized>, v: &Option<Quantized>) -> Vec<Array> {
    k.iter().chain(v.iter()).flatten().cloned().collect()
}

/// One sequence's quantized KV cache (mlx-lm `QuantizedKVCache`).
#[derive(Clone)]
pub struct QuantizedKvCache {
    keys: Option<Quantized>,
    values: Option<Quantized>,
    offset: i32,
    group_size: i32,
    bits: i32,
}

impl QuantizedKvCache {
    pub fn new(group_size: i32, bits: i32) -> Self {
        QuantizedKvCache { keys: None, values: None, offset: 0, group_size, bits }
    }

    /// mlx-lm's `KVCache.to_quantized`: the whole storage (capacity included) is quantized.
    pub fn from_full(cache: &KvCacheSingle, group_size: i32, bits: i32) -> Result<Self> {
        let mut q = QuantizedKvCache::new(group_size, bits);
        if let Some((k, v)) = cache.storage() {
            q.keys = Some(quantize_kv(&k, group_size, bits)?);
            q.values = Some(quantize_kv(&v, group_size, bits)?);
        }
        q.offset = cache.len() as i32;
        Ok(q)
    }

    /// The cached triples, cut to the positions in use.
    pub fn keys_values(&self) -> Option<(Quantized, Quantized)> {
        let (k, v) = (self.keys.as_ref()?, self.values.as_ref()?);
        Some((slice_cols(k, 0..self.offset), slice_cols(v, 0..self.offset)))
    }

    fn store(&mut self, keys: &Array, values: &Array) -> Result<(Quantized, Quantized)> {
        let k = write_quantized(&mut self.keys, self.offset, &quantize_kv(keys, self.group_size, self.bits)?)?;
        let v = write_quantized(&mut self.values, self.offset, &quantize_kv(values, self.group_size, self.bits)?)?;
        self.offset += keys.dim(2);
        Ok((k, v))
    }

    /// A cache holding exactly these `[1, H, len, *]` triples (as [`KvCache::export`] names
    /// them: `{keys,values}.{weights,scales,biases}`); `None` when one is missing or their
    /// lengths disagree.
    pub(crate) fn from_saved(arrays: &[(String, Array)], group_size: i32, bits: i32) -> Option<Self> {
        let triple = |what: &str| -> Option<Quantized> {
            let part = |p: &str| arrays.iter().find(|(n, _)| *n == format!("{what}.{p}")).map(|(_, a)| a.clone());
            let q = [part("weights")?, part("scales")?, part("biases")?];
            (q.iter().all(|a| a.ndim() == 4 && a.dim(2) == q[0].dim(2))).then_some(q)
        };
        let (keys, values) = (triple("keys")?, triple("values")?);
        let offset = keys[0].dim(2);
        (values[0].dim(2) == offset).then_some(QuantizedKvCache { keys: Some(keys), values: Some(values), offset, group_size, bits })
    }

    fn export_arrays(&self) -> Option<Vec<(String, Array)>> {
        let (k, v) = self.keys_values()?;
        let named = |what: &str, q: Quantized| {
            let [w, s, b] = q;
            [(format!("{what}.weights"), w), (format!("{what}.scales"), s), (format!("{what}.biases"), b)]
        };
        Some(named("keys", k).into_iter().chain(named("values", v)).collect())
    }
}

impl AttentionCache for QuantizedKvCache {
    fn rope_offset(&self) -> RopeOffset {
        RopeOffset::Scalar(self.offset)
    }

    /// Stores the step and returns the whole history dequantized (attention itself runs on the
    /// packed form through `update_and_attend`).
    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        let (k, v) = self.store(keys, values)?;
        Ok((dequantize_kv(&k, self.group_size, self.bits)?, dequantize_kv(&v, self.group_size, self.bits)?))
    }

    fn update_and_attend(&mut self, q: &Array, k: &Array, v: &Array, scale: f32, mask: &AttentionMask, _fast: bool) -> Result<Array> {
        let (k, v) = self.store(k, v)?;
        quantized_sdpa(q, &k, &v, scale, mask, self.group_size, self.bits)
    }

    fn make_mask(&self, n: i32, window: Option<i32>) -> Result<AttentionMask> {
        Ok(match window {
            Some(w) => AttentionMask::Array(causal_mask(n, self.offset, Some(w))?),
            None if n == 1 => AttentionMask::None,
            None => AttentionMask::Causal,
        })
    }

    fn kv_quantization(&self) -> Option<(i32, i32)> {
        Some((self.group_size, self.bits))
    }
}

impl KvCache for QuantizedKvCache {
    super::faces!(attention);

    fn len(&self) -> usize {
        self.offset as usize
    }

    fn nbytes(&self) -> usize {
        nbytes(&self.keys) + nbytes(&self.values)
    }

    fn state(&self) -> Vec<Array> {
        state(&self.keys, &self.values)
    }

    fn into_batched(self: Box<Self>) -> Result<Box<dyn KvCache>> {
        Ok(Box::new(BatchQuantizedKvCache::from_single(*self)))
    }

    fn trim(&mut self, n: usize) -> usize {
        let n = (n as i32).min(self.offset);
        self.offset -= n;
        n as usize
    }

    fn always_trims(&self) -> bool {
        true
    }

    fn export(&self) -> Option<super::CacheParts> {
        let ints = vec![self.bits as i64, self.group_size as i64];
        Some(super::CacheParts { kind: "quantized".into(), arrays: self.export_arrays()?, ints })
    }

    fn duplicate(&self) -> Box<dyn KvCache> {
        Box::new(self.clone())
    }

    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any> {
        self
    }
}

/// Left-padded rows of quantized KV sharing one column index (the quantized counterpart of
/// [`BatchKvCache`]; see there for the padding and mask conventions).
#[derive(Clone)]
pub struct BatchQuantizedKvCache {
    keys: Option<Quantized>,
    values: Option<Quantized>,
    left_padding: Vec<i32>,
    idx: i32,
    group_size: i32,
    bits: i32,
}

impl BatchQuantizedKvCache {
    pub fn from_single(single: QuantizedKvCache) -> Self {
        let (group_size, bits) = (single.group_size, single.bits);
        match single.keys_values() {
            Some((k, v)) => {
                let idx = k[0].dim(2);
                BatchQuantizedKvCache { keys: Some(k), values: Some(v), left_padding: vec![0], idx, group_size, bits }
            }
            None => BatchQuantizedKvCache { keys: None, values: None, left_padding: vec![0], idx: 0, group_size, bits },
        }
    }

    /// A batched full-precision cache quantized as a whole (its storage, capacity included).
    pub fn from_full(keys: Option<(Array, Array)>, left_padding: Vec<i32>, idx: i32, group_size: i32, bits: i32) -> Result<Self> {
        let (keys, values) = match keys {
            Some((k, v)) => (Some(quantize_kv(&k, group_size, bits)?), Some(quantize_kv(&v, group_size, bits)?)),
            None => (None, None),
        };
        Ok(BatchQuantizedKvCache { keys, values, left_padding, idx, group_size, bits })
    }

    pub fn left_padding(&self) -> &[i32] {
        &self.left_padding
    }

    fn store(&mut self, keys: &Array, values: &Array) -> Result<(Quantized, Quantized)> {
        let k = write_quantized(&mut self.keys, self.idx, &quantize_kv(keys, self.group_size, self.bits)?)?;
        let v = write_quantized(&mut self.values, self.idx, &quantize_kv(values, self.group_size, self.bits)?)?;
        self.idx += keys.dim(2);
        Ok((k, v))
    }

    /// `[B, H, T, *]` parts padded with zero columns: `left` before, up to `width` in total.
    /// Zero weights/scales/biases dequantize to 0, and padded columns are masked anyway.
    fn pad(q: &Quantized, left: i32, width: i32) -> Result<Quantized> {
        let parts: Vec<Array> = q
            .iter()
            .map(|a| -> Result<Array> {
                let (b, h, t, d) = (a.dim(0), a.dim(1), a.dim(2), a.dim(3));
                let mut cols = Vec::new();
                if left > 0 {
                    cols.push(zeros_dtype(&[b, h, left, d], a.dtype())?);
                }
                cols.push(a.clone());
                if width - left - t > 0 {
                    cols.push(zeros_dtype(&[b, h, width - left - t, d], a.dtype())?);
                }
                Ok(if cols.len() == 1 { cols.pop().unwrap() } else { concatenate(&cols, 2)? })
            })
            .collect::<Result<_>>()?;
        parts.try_into().map_err(|_| Error::Mlx("quantized cache parts".into()))
    }

    fn zeros_like_rows(template: &Quantized, rows: i32, width: i32) -> Result<Quantized> {
        let parts: Vec<Array> = template
            .iter()
            .map(|a| Ok(zeros_dtype(&[rows, a.dim(1), width, a.dim(3)], a.dtype())?))
            .collect::<Result<_>>()?;
        parts.try_into().map_err(|_| Error::Mlx("quantized cache parts".into()))
    }

    fn take_rows(q: &Quantized, idx: &Array) -> Result<Quantized> {
        Ok([q[0].take_axis(idx, 0)?, q[1].take_axis(idx, 0)?, q[2].take_axis(idx, 0)?])
    }
}

impl AttentionCache for BatchQuantizedKvCache {
    fn rope_offset(&self) -> RopeOffset {
        let offsets: Vec<i32> = self.left_padding.iter().map(|lp| self.idx - lp).collect();
        RopeOffset::PerRow(Array::from_slice(&offsets, &[offsets.len() as i32]))
    }

    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        let (k, v) = self.store(keys, values)?;
        Ok((dequantize_kv(&k, self.group_size, self.bits)?, dequantize_kv(&v, self.group_size, self.bits)?))
    }

    fn update_and_attend(&mut self, q: &Array, k: &Array, v: &Array, scale: f32, mask: &AttentionMask, _fast: bool) -> Result<Array> {
        let (k, v) = self.store(k, v)?;
        quantized_sdpa(q, &k, &v, scale, mask, self.group_size, self.bits)
    }

    fn make_mask(&self, n: i32, window: Option<i32>) -> Result<AttentionMask> {
        Ok(AttentionMask::Array(left_padded_mask(self.idx, &self.left_padding, n, window)?))
    }

    fn kv_quantization(&self) -> Option<(i32, i32)> {
        Some((self.group_size, self.bits))
    }
}

impl BatchRows for BatchQuantizedKvCache {
    fn rows(&self) -> usize {
        self.left_padding.len()
    }

    /// Right-aligns both batches to the larger column index, as `BatchKvCache` does.
    fn extend_rows(&mut self, other: Box<dyn KvCache>) -> Result<()> {
        let other = other
            .into_any()
            .downcast::<BatchQuantizedKvCache>()
            .map_err(|_| Error::Unsupported("joining caches of different kinds".into()))?;
        if (other.group_size, other.bits) != (self.group_size, self.bits) {
            return Err(Error::Unsupported("joining KV caches quantized with different settings".into()));
        }
        let max_idx = self.idx.max(other.idx);
        let template = self.keys.clone().zip(self.values.clone()).or_else(|| other.keys.clone().zip(other.values.clone()));
        let Some((tk, tv)) = template else {
            self.left_padding.extend(other.left_padding.iter().copied());
            return Ok(());
        };
        let pad = |c: &BatchQuantizedKvCache| -> Result<(Quantized, Quantized, Vec<i32>)> {
            let left = max_idx - c.idx;
            let lp: Vec<i32> = c.left_padding.iter().map(|p| p + left).collect();
            let rows = c.left_padding.len() as i32;
            Ok(match (&c.keys, &c.values) {
                (Some(k), Some(v)) => {
                    let (k, v) = (slice_cols(k, 0..c.idx), slice_cols(v, 0..c.idx));
                    (Self::pad(&k, left, max_idx)?, Self::pad(&v, left, max_idx)?, lp)
                }
                _ => (Self::zeros_like_rows(&tk, rows, max_idx)?, Self::zeros_like_rows(&tv, rows, max_idx)?, lp),
            })
        };
        let (k1, v1, lp1) = pad(self)?;
        let (k2, v2, lp2) = pad(&other)?;
        let cat = |a: Quantized, b: Quantized| -> Result<Quantized> {
            let parts: Vec<Array> =
                a.into_iter().zip(b).map(|(x, y)| Ok(concatenate(&[x, y], 0)?)).collect::<Result<_>>()?;
            parts.try_into().map_err(|_| Error::Mlx("quantized cache parts".into()))
        };
        self.keys = Some(cat(k1, k2)?);
        self.values = Some(cat(v1, v2)?);
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
            self.keys = Some(Self::take_rows(k, &idx_arr)?);
            self.values = Some(Self::take_rows(v, &idx_arr)?);
        }
        let shared = self.left_padding.iter().copied().min().unwrap_or(0);
        if shared > 0 {
            if let (Some(k), Some(v)) = (&self.keys, &self.values) {
                let end = k[0].dim(2);
                self.keys = Some(slice_cols(k, shared..end));
                self.values = Some(slice_cols(v, shared..end));
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
        let mut single = QuantizedKvCache::new(self.group_size, self.bits);
        if let (Some(k), Some(v)) = (&self.keys, &self.values) {
            let cut = |q: &Quantized| -> Result<Quantized> {
                let parts: Vec<Array> =
                    q.iter().map(|a| Ok(a.index((r..r + 1, .., lp..self.idx, ..)).contiguous()?)).collect::<Result<_>>()?;
                parts.try_into().map_err(|_| Error::Mlx("quantized cache parts".into()))
            };
            single.keys = Some(cut(k)?);
            single.values = Some(cut(v)?);
            single.offset = self.idx - lp;
        }
        Ok(Box::new(single))
    }
}

impl KvCache for BatchQuantizedKvCache {
    super::faces!(attention, batch_rows);

    fn into_batched(self: Box<Self>) -> Result<Box<dyn KvCache>> {
        Ok(self)
    }

    fn len(&self) -> usize {
        self.idx as usize
    }

    fn nbytes(&self) -> usize {
        nbytes(&self.keys) + nbytes(&self.values)
    }

    fn state(&self) -> Vec<Array> {
        state(&self.keys, &self.values)
    }

    fn trim(&mut self, n: usize) -> usize {
        let n = (n as i32).min(self.idx);
        self.idx -= n;
        n as usize
    }

    fn duplicate(&self) -> Box<dyn KvCache> {
        Box::new(BatchQuantizedKvCache {
            keys: self.keys.clone(),
            values: self.values.clone(),
            left_padding: self.left_padding.clone(),
            idx: self.idx,
            group_size: self.group_size,
            bits: self.bits,
        })
    }

    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any> {
        self
    }
}

impl BatchKvCache {
    /// This batch with its keys and values quantized (storage and capacity included).
    pub fn to_quantized_batch(&self, group_size: i32, bits: i32) -> Result<BatchQuantizedKvCache> {
        BatchQuantizedKvCache::from_full(self.storage(), self.left_padding().to_vec(), self.len() as i32, group_size, bits)
    }
}

/// Wraps each full-attention cache of `caches` (a model's fresh `make_caches()`) so it
/// quantizes itself as `q` says; `None` leaves them full precision. Caches without a quantized
/// form (sliding-window rings, recurrent state) are returned as they are.
pub fn quantizing(caches: Vec<Box<dyn KvCache>>, q: Option<&KvQuantization>) -> Vec<Box<dyn KvCache>> {
    let Some(q) = q else { return caches };
    caches
        .into_iter()
        .map(|c| {
            if !(c.as_ref() as &dyn std::any::Any).is::<KvCacheSingle>() {
                return c;
            }
            let single = c.into_any().downcast::<KvCacheSingle>().expect("checked above");
            Box::new(QuantizingKvCache { q: *q, form: Form::Full(*single) }) as Box<dyn KvCache>
        })
        .collect()
}

/// Where a [`QuantizingKvCache`] keeps its keys and values now.
#[derive(Clone)]
enum Form {
    Full(KvCacheSingle),
    FullBatch(BatchKvCache),
    Quantized(QuantizedKvCache),
    QuantizedBatch(BatchQuantizedKvCache),
}

/// A full-attention KV cache under a [`KvQuantization`] policy: full precision until it holds
/// `start` positions, then quantized (mlx-lm's `maybe_quantize_kv_cache`, which converts after
/// each forward: a layer updates its cache once per forward, so converting right after the
/// update is the same point). A quantized row joining a full-precision batch converts the
/// batch; a full-precision row joining a quantized batch is converted first.
#[derive(Clone)]
pub struct QuantizingKvCache {
    q: KvQuantization,
    form: Form,
}

impl QuantizingKvCache {
    fn inner(&self) -> &dyn KvCache {
        match &self.form {
            Form::Full(c) => c,
            Form::FullBatch(c) => c,
            Form::Quantized(c) => c,
            Form::QuantizedBatch(c) => c,
        }
    }

    fn inner_attention(&mut self) -> &mut dyn AttentionCache {
        match &mut self.form {
            Form::Full(c) => c,
            Form::FullBatch(c) => c,
            Form::Quantized(c) => c,
            Form::QuantizedBatch(c) => c,
        }
    }

    fn is_quantized(&self) -> bool {
        matches!(self.form, Form::Quantized(_) | Form::QuantizedBatch(_))
    }

    fn quantize(&mut self) -> Result<()> {
        let (g, b) = (self.q.group_size, self.q.bits);
        self.form = match &self.form {
            Form::Full(c) => Form::Quantized(QuantizedKvCache::from_full(c, g, b)?),
            Form::FullBatch(c) => Form::QuantizedBatch(c.to_quantized_batch(g, b)?),
            _ => return Ok(()),
        };
        Ok(())
    }

    fn quantize_when_full(&mut self) -> Result<()> {
        if !self.is_quantized() && self.inner().len() >= self.q.start {
            self.quantize()?;
        }
        Ok(())
    }

    /// A cache saved by [`KvCache::export`] under policy `q`: full precision (`keys`,
    /// `values`) or quantized (as [`QuantizedKvCache`] names its triples); `None` when the
    /// arrays do not make one.
    pub(crate) fn from_saved(q: KvQuantization, quantized: bool, arrays: &[(String, Array)]) -> Option<Self> {
        let form = if quantized {
            Form::Quantized(QuantizedKvCache::from_saved(arrays, q.group_size, q.bits)?)
        } else {
            let array = |name: &str| arrays.iter().find(|(n, _)| n == name).map(|(_, a)| a.clone());
            let (k, v) = (array("keys")?, array("values")?);
            if k.ndim() != 4 || v.ndim() != 4 || k.dim(2) != v.dim(2) {
                return None;
            }
            Form::Full(KvCacheSingle::from_keys_values(k, v))
        };
        Some(QuantizingKvCache { q, form })
    }

    fn wrap(&self, cache: Box<dyn KvCache>) -> Result<Self> {
        let any = cache.into_any();
        let form = match any.downcast::<KvCacheSingle>() {
            Ok(c) => Form::Full(*c),
            Err(any) => match any.downcast::<QuantizedKvCache>() {
                Ok(c) => Form::Quantized(*c),
                Err(_) => return Err(Error::Mlx("a quantizing cache's row is neither full nor quantized KV".into())),
            },
        };
        Ok(QuantizingKvCache { q: self.q, form })
    }
}

impl AttentionCache for QuantizingKvCache {
    fn rope_offset(&self) -> RopeOffset {
        self.inner().attention_ref().expect("KV caches attend").rope_offset()
    }

    fn make_mask(&self, n: i32, window: Option<i32>) -> Result<AttentionMask> {
        self.inner().attention_ref().expect("KV caches attend").make_mask(n, window)
    }

    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        let out = self.inner_attention().update_and_fetch(keys, values)?;
        self.quantize_when_full()?;
        Ok(out)
    }

    fn update_and_attend(&mut self, q: &Array, k: &Array, v: &Array, scale: f32, mask: &AttentionMask, fast: bool) -> Result<Array> {
        let out = self.inner_attention().update_and_attend(q, k, v, scale, mask, fast)?;
        self.quantize_when_full()?;
        Ok(out)
    }

    fn kv_quantization(&self) -> Option<(i32, i32)> {
        self.is_quantized().then_some((self.q.group_size, self.q.bits))
    }
}

impl BatchRows for QuantizingKvCache {
    fn rows(&self) -> usize {
        match &self.form {
            Form::FullBatch(c) => c.rows(),
            Form::QuantizedBatch(c) => c.rows(),
            _ => 1,
        }
    }

    fn extend_rows(&mut self, other: Box<dyn KvCache>) -> Result<()> {
        let mut other = *other
            .into_any()
            .downcast::<QuantizingKvCache>()
            .map_err(|_| Error::Unsupported("joining caches of different kinds".into()))?;
        if self.q != other.q {
            return Err(Error::Unsupported("joining KV caches quantized with different settings".into()));
        }
        match (self.is_quantized(), other.is_quantized()) {
            (false, true) => self.quantize()?,
            (true, false) => other.quantize()?,
            _ => {}
        }
        match (&mut self.form, other.form) {
            (Form::FullBatch(a), Form::FullBatch(b)) => a.extend_rows(Box::new(b)),
            (Form::QuantizedBatch(a), Form::QuantizedBatch(b)) => a.extend_rows(Box::new(b)),
            _ => Err(Error::Unsupported("this cache is not batched (into_batched first)".into())),
        }
    }

    fn filter_rows(&mut self, keep: &[usize]) -> Result<()> {
        match &mut self.form {
            Form::FullBatch(c) => c.filter_rows(keep),
            Form::QuantizedBatch(c) => c.filter_rows(keep),
            _ => Err(Error::Unsupported("this cache is not batched (into_batched first)".into())),
        }
    }

    fn extract_row(&self, row: usize) -> Result<Box<dyn KvCache>> {
        let single = match &self.form {
            Form::FullBatch(c) => c.extract_row(row)?,
            Form::QuantizedBatch(c) => c.extract_row(row)?,
            _ => return Err(Error::Unsupported("this cache is not batched (into_batched first)".into())),
        };
        Ok(Box::new(self.wrap(single)?))
    }

    fn take_only_row(&mut self) -> Result<Box<dyn KvCache>> {
        let single = match &mut self.form {
            Form::FullBatch(c) => c.take_only_row()?,
            Form::QuantizedBatch(c) => c.extract_row(0)?,
            _ => return Err(Error::Unsupported("this cache is not batched (into_batched first)".into())),
        };
        Ok(Box::new(self.wrap(single)?))
    }
}

impl KvCache for QuantizingKvCache {
    super::faces!(attention);

    fn batch_rows(&mut self) -> Option<&mut dyn BatchRows> {
        matches!(self.form, Form::FullBatch(_) | Form::QuantizedBatch(_)).then_some(self as &mut dyn BatchRows)
    }

    fn batch_rows_ref(&self) -> Option<&dyn BatchRows> {
        matches!(self.form, Form::FullBatch(_) | Form::QuantizedBatch(_)).then_some(self as &dyn BatchRows)
    }

    fn len(&self) -> usize {
        self.inner().len()
    }

    fn nbytes(&self) -> usize {
        self.inner().nbytes()
    }

    fn state(&self) -> Vec<Array> {
        self.inner().state()
    }

    fn always_trims(&self) -> bool {
        true
    }

    fn trim(&mut self, n: usize) -> usize {
        match &mut self.form {
            Form::Full(c) => c.trim(n),
            Form::FullBatch(c) => c.trim(n),
            Form::Quantized(c) => c.trim(n),
            Form::QuantizedBatch(c) => c.trim(n),
        }
    }

    /// Kind `quantizing`: the policy (`bits`, `group_size`, `start`, whether converted yet) in
    /// the integers, the full-precision or quantized arrays as the inner cache names them.
    fn export(&self) -> Option<super::CacheParts> {
        let (quantized, arrays) = match &self.form {
            Form::Full(c) => (0, c.export()?.arrays),
            Form::Quantized(c) => (1, c.export_arrays()?),
            _ => return None,
        };
        let ints = vec![self.q.bits as i64, self.q.group_size as i64, self.q.start as i64, quantized];
        Some(super::CacheParts { kind: "quantizing".into(), arrays, ints })
    }

    fn into_batched(self: Box<Self>) -> Result<Box<dyn KvCache>> {
        let QuantizingKvCache { q, form } = *self;
        let form = match form {
            Form::Full(c) => Form::FullBatch(BatchKvCache::from_single(c)?),
            Form::Quantized(c) => Form::QuantizedBatch(BatchQuantizedKvCache::from_single(c)),
            batched => batched,
        };
        Ok(Box::new(QuantizingKvCache { q, form }))
    }

    fn duplicate(&self) -> Box<dyn KvCache> {
        Box::new(self.clone())
    }

    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any> {
        self
    }
}
