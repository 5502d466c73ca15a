//! Gemma 4's audio tower (`audio_tower.*`) and its embedder (`embed_audio.*`), op for op as
//! mlx-vlm 0.7.10's `gemma4/audio.py` `AudioEncoder` and `gemma4.py` `MultimodalEmbedder`:
//!
//! - SSCP: two `Conv2d(3x3, stride 2)` blocks over (time, mel) with symmetric padding, each
//!   followed by LayerNorm over channels (no bias) and ReLU; flatten (freq, channels); Linear.
//! - Conformer blocks (macaron): FF/2 -> chunked local self-attention (chunks of 12, 12 past
//!   frames of context, relative sinusoidal positions, logit softcap, invalid logits -1e9) ->
//!   light conv (GLU, causal depthwise Conv1d, RMSNorm, SiLU) -> FF/2 -> RMSNorm. Linears clamp
//!   their input and output to ranges stored in the checkpoint ("clipped linears").
//! - `output_proj` (with bias), padded frames zeroed; the embedder is RMSNorm without scale +
//!   a bias-free projection into the text hidden size.
//!
//! Masks (which frames are padding) are host-side: they follow from the clip's length only.

use std::collections::HashMap;
use std::path::Path;

use mlx_rs::ops::indexing::{take_axis, IndexOp};
use mlx_rs::ops::{
    clip, concatenate, conv2d, conv_general, einsum, exp, logaddexp, maximum, pad, select, sigmoid, sin, cos, split_equal,
    softmax_axis, tanh,
};
use mlx_rs::{Array, Dtype};
use serde::Deserialize;

use crate::nn::{Linear, RmsNorm, Weights};
use crate::{Error, Result};

/// `audio_config` of a Gemma 4 checkpoint (mlx-vlm `AudioConfig`; defaults are its defaults).
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct AudioConfig {
    pub hidden_size: i32,
    pub num_hidden_layers: usize,
    pub num_attention_heads: i32,
    pub hidden_act: String,
    pub subsampling_conv_channels: Vec<i32>,
    pub conv_kernel_size: i32,
    pub residual_weight: f32,
    pub attention_chunk_size: i32,
    pub attention_context_left: i32,
    pub attention_context_right: i32,
    pub attention_logit_cap: f32,
    pub attention_invalid_logits_value: f32,
    pub use_clipped_linears: bool,
    pub rms_norm_eps: f32,
    pub gradient_clipping: f32,
    pub output_proj_dims: Option<i32>,
}

impl Default for AudioConfig {
    fn default() -> Self {
        AudioConfig {
            hidden_size: 1024,
            num_hidden_layers: 12,
            num_attention_heads: 8,
            hidden_act: "silu".into(),
            subsampling_conv_channels: vec![128, 32],
            conv_kernel_size: 5,
            residual_weight: 0.5,
            attention_chunk_size: 12,
            attention_context_left: 13,
            attention_context_right: 0,
            attention_logit_cap: 50.0,
            attention_invalid_logits_value: -1e9,
            use_clipped_linears: true,
            rms_norm_eps: 1e-6,
            gradient_clipping: 1e10,
            output_proj_dims: Some(1536),
        }
    }
}

/// Mel bins the SSCP expects (mlx-vlm's `SubSampleConvProjection.INPUT_FEAT_SIZE`).
pub const INPUT_FEAT_SIZE: i32 = 128;

fn scalar(v: f32, like: &Array) -> Result<Array> {
    Ok(Array::from_f32(v).as_dtype(like.dtype())?)
}

fn silu(x: &Array) -> Result<Array> {
    Ok(x.multiply(sigmoid(x)?)?)
}

/// `mx.clip(x, -g, g)`: the tower's "gradient clipping" of activations (bounds in x's dtype,
/// as Python scalars are).
fn clip_g(x: &Array, g: f32) -> Result<Array> {
    Ok(clip(x, (&scalar(-g, x)?, &scalar(g, x)?))?)
}

/// Linear with the input and output clamped to checkpoint ranges (mlx-vlm `ClippableLinear`);
/// a range missing from the checkpoint stays at +-inf (a no-op), as mlx-vlm initialises it.
pub(crate) struct ClippedLinear {
    linear: Linear,
    input: Option<(Array, Array)>,
    output: Option<(Array, Array)>,
}

impl ClippedLinear {
    pub(crate) fn load(w: &mut Weights, prefix: &str, in_dim: i32, out_dim: i32, clipped: bool) -> Result<Self> {
        let linear = Linear::load(w, &format!("{prefix}.linear"), in_dim, out_dim, false)?;
        let mut range = |lo: &str, hi: &str| -> Result<Option<(Array, Array)>> {
            if !clipped {
                return Ok(None);
            }
            let lo = w.take_opt(&format!("{prefix}.{lo}"), &[])?;
            let hi = w.take_opt(&format!("{prefix}.{hi}"), &[])?;
            Ok(match (lo, hi) {
                (None, None) => None,
                (lo, hi) => Some((
                    lo.unwrap_or_else(|| Array::from_f32(f32::NEG_INFINITY)),
                    hi.unwrap_or_else(|| Array::from_f32(f32::INFINITY)),
                )),
            })
        };
        let input = range("input_min", "input_max")?;
        let output = range("output_min", "output_max")?;
        Ok(ClippedLinear { linear, input, output })
    }

    pub(crate) fn forward(&self, x: &Array) -> Result<Array> {
        let x = match &self.input {
            Some((lo, hi)) => clip(x, (lo, hi))?,
            None => x.clone(),
        };
        let y = self.linear.forward(&x)?;
        Ok(match &self.output {
            Some((lo, hi)) => clip(&y, (lo, hi))?,
            None => y,
        })
    }
}

struct SscpBlock {
    conv: Array,
    norm: Array,
    eps: f32,
}

impl SscpBlock {
    /// x: `[B, T, F, C]`; `invalid[b][t]` = padding frame. Returns the block output and the mask
    /// downsampled by the time stride (`mask[:, ::2][:, :t_out]`).
    fn forward(&self, x: &Array, invalid: &[Vec<bool>]) -> Result<(Array, Vec<Vec<bool>>)> {
        let (b, t) = (x.dim(0), x.dim(1));
        let m = mask_array(invalid, &[b, t, 1, 1])?;
        let x = select(&m, &scalar(0.0, x)?, x)?;
        let x = pad(&x, &[(0, 0), (1, 1), (1, 1), (0, 0)][..], None, None)?;
        let x = conv2d(&x, &self.conv, (2, 2), (0, 0), None, None)?;
        let t_out = x.dim(1) as usize;
        let out_mask = invalid.iter().map(|row| row.iter().step_by(2).take(t_out).copied().collect()).collect();
        let x = mlx_rs::fast::layer_norm(&x, Some(&self.norm), None, self.eps)?;
        Ok((maximum(&x, &scalar(0.0, &x)?)?, out_mask))
    }
}

/// `[B, ...]` bool array from host rows (`true` where the frame is padding).
fn mask_array(invalid: &[Vec<bool>], shape: &[i32]) -> Result<Array> {
    let flat: Vec<bool> = invalid.iter().flatten().copied().collect();
    Ok(Array::from_slice(&flat, shape))
}

struct FeedForward {
    pre_norm: RmsNorm,
    ffw1: ClippedLinear,
    ffw2: ClippedLinear,
    post_norm: RmsNorm,
    residual_weight: f32,
    grad_clip: f32,
}

impl FeedForward {
    fn load(w: &mut Weights, p: &str, c: &AudioConfig) -> Result<Self> {
        let d = c.hidden_size;
        Ok(FeedForward {
            // mlx-vlm builds these norms with the default eps (1e-6), not `rms_norm_eps`.
            pre_norm: RmsNorm::load(w, &format!("{p}.pre_layer_norm"), d, 1e-6)?,
            ffw1: ClippedLinear::load(w, &format!("{p}.ffw_layer_1"), d, d * 4, c.use_clipped_linears)?,
            ffw2: ClippedLinear::load(w, &format!("{p}.ffw_layer_2"), d * 4, d, c.use_clipped_linears)?,
            post_norm: RmsNorm::load(w, &format!("{p}.post_layer_norm"), d, 1e-6)?,
            residual_weight: c.residual_weight,
            grad_clip: c.gradient_clipping,
        })
    }

    fn forward(&self, x: &Array) -> Result<Array> {
        let h = clip_g(x, self.grad_clip)?;
        let h = self.pre_norm.forward(&h)?;
        let h = silu(&self.ffw1.forward(&h)?)?;
        let h = self.ffw2.forward(&h)?;
        let h = clip_g(&h, self.grad_clip)?;
        let h = self.post_norm.forward(&h)?;
        Ok(x.add(h.multiply(scalar(self.residual_weight, &h)?)?)?)
    }
}

struct ChunkedAttention {
    q_proj: ClippedLinear,
    k_proj: ClippedLinear,
    v_proj: ClippedLinear,
    post: ClippedLinear,
    relative_k_proj: Linear,
    per_dim_scale: Array,
    heads: i32,
    head_dim: i32,
    chunk: i32,
    max_past: i32,
    max_future: i32,
    context: i32,
    softcap: f32,
    invalid_logit: f32,
    /// `[1, 1, hidden / 2]` inverse timescales of the relative position signal.
    inv_timescales: Array,
    /// `[chunk, context]`: which keys of a block's context each query may see.
    causal_valid: Array,
}

impl ChunkedAttention {
    fn load(w: &mut Weights, p: &str, c: &AudioConfig) -> Result<Self> {
        let d = c.hidden_size;
        let heads = c.num_attention_heads;
        let head_dim = d / heads;
        let chunk = c.attention_chunk_size;
        let max_past = (c.attention_context_left - 1).max(0);
        let max_future = c.attention_context_right;
        let context = chunk + max_past + max_future;
        let clipped = c.use_clipped_linears;
        // inv_timescales = exp(arange(n) * -log(1e4) / max(n - 1, 1)), in float32 as mlx.
        let n = d / 2;
        let inc = (10000.0f64).ln() / ((n - 1).max(1)) as f64;
        let ar = Array::from_iter(0..n, &[n]);
        let inv_timescales = exp(ar.multiply(Array::from_f32(-inc as f32))?)?.reshape(&[1, 1, n])?;
        let mut valid = Vec::with_capacity((chunk * context) as usize);
        for q in 0..chunk {
            for k in 0..context {
                let dist = q + max_past - k;
                valid.push((dist >= 0 && dist < max_past) || (dist < 0 && -dist < max_future));
            }
        }
        let attn = ChunkedAttention {
            q_proj: ClippedLinear::load(w, &format!("{p}.q_proj"), d, heads * head_dim, clipped)?,
            k_proj: ClippedLinear::load(w, &format!("{p}.k_proj"), d, heads * head_dim, clipped)?,
            v_proj: ClippedLinear::load(w, &format!("{p}.v_proj"), d, heads * head_dim, clipped)?,
            post: ClippedLinear::load(w, &format!("{p}.post"), d, d, clipped)?,
            relative_k_proj: Linear::load(w, &format!("{p}.relative_k_proj"), d, heads * head_dim, false)?,
            per_dim_scale: w.take(&format!("{p}.per_dim_scale"), &[head_dim])?,
            heads,
            head_dim,
            chunk,
            max_past,
            max_future,
            context,
            softcap: c.attention_logit_cap,
            invalid_logit: c.attention_invalid_logits_value,
            inv_timescales,
            causal_valid: Array::from_slice(&valid, &[chunk, context]),
        };
        attn.inv_timescales.eval()?;
        Ok(attn)
    }

    /// `[B, T, ...]` -> `[B, U, chunk, ...]`, zero-padding T up to whole chunks.
    fn to_blocks(&self, x: &Array) -> Result<Array> {
        let shape = x.shape().to_vec();
        let (b, t) = (shape[0], shape[1]);
        let u = (t + self.chunk - 1) / self.chunk;
        let pad_len = u * self.chunk - t;
        let x = if pad_len > 0 { pad_dim1(x, 0, pad_len)? } else { x.clone() };
        let mut new_shape = vec![b, u, self.chunk];
        new_shape.extend_from_slice(&shape[2..]);
        Ok(x.reshape(&new_shape)?)
    }

    /// `[B, T, ...]` -> `[B, U, context, ...]`: each block's keys, `max_past` frames before it.
    fn block_context(&self, x: &Array) -> Result<Array> {
        let x = pad_dim1(x, self.max_past, self.max_future + self.chunk - 1)?;
        let shape = x.shape().to_vec();
        let u = (shape[1] - self.context) / self.chunk + 1;
        let idx: Vec<i32> = (0..u).flat_map(|b| (0..self.context).map(move |o| b * self.chunk + o)).collect();
        let g = take_axis(&x, Array::from_slice(&idx, &[u * self.context]), 1)?;
        let mut new_shape = vec![shape[0], u, self.context];
        new_shape.extend_from_slice(&shape[2..]);
        Ok(g.reshape(&new_shape)?)
    }

    /// Content + relative-position logits `[B, N, U, W, C]` (mlx-vlm
    /// `AudioRelativePositionEmbedding.__call__`, with its `_relative_shift`).
    fn logits(&self, queries: &Array, keys: &Array) -> Result<Array> {
        let (b, u, w, n, h) = (queries.dim(0), queries.dim(1), queries.dim(2), queries.dim(3), queries.dim(4));
        let c = keys.dim(2);
        let span: Vec<i32> = (-self.max_future..=self.max_past).rev().collect();
        let s = span.len() as i32;
        let pos = Array::from_slice(&span, &[1, s]).as_dtype(Dtype::Float32)?;
        let scaled = pos.reshape(&[1, s, 1])?.multiply(&self.inv_timescales)?;
        let signal = concatenate(&[sin(&scaled)?, cos(&scaled)?], -1)?.as_dtype(queries.dtype())?;
        let sin_emb = self.relative_k_proj.forward(&signal.as_dtype(self.per_dim_scale.dtype())?)?;
        let sin_emb = sin_emb.reshape(&[s, n, h])?.as_dtype(queries.dtype())?;

        let q = queries.transpose_axes(&[0, 3, 1, 2, 4])?;
        let k = keys.transpose_axes(&[0, 3, 1, 4, 2])?;
        let ac = q.matmul(&k)?;
        let bd = q.reshape(&[b, n, u * w, h])?.matmul(sin_emb.transpose_axes(&[1, 2, 0])?)?;
        let bd = bd.reshape(&[b, n, u, w, s])?;
        // Relative shift: pad the span to context + 1, fold, drop the tail, unfold.
        let bd = pad(&bd, &[(0, 0), (0, 0), (0, 0), (0, 0), (0, (c + 1) - s)][..], None, None)?;
        let bd = bd.reshape(&[b, n, u, w * (c + 1)])?;
        let bd = bd.index((.., .., .., ..(w * c)));
        let bd = bd.reshape(&[b, n, u, w, c])?;
        Ok(ac.add(bd)?)
    }

    fn forward(&self, x: &Array, invalid: &[Vec<bool>]) -> Result<Array> {
        let (b, t) = (x.dim(0), x.dim(1));
        let qkv_shape = [b, t, self.heads, self.head_dim];
        let q = self.q_proj.forward(x)?.as_dtype(Dtype::Float32)?.reshape(&qkv_shape)?;
        let k = self.k_proj.forward(x)?.as_dtype(Dtype::Float32)?.reshape(&qkv_shape)?;
        let v = self.v_proj.forward(x)?.as_dtype(Dtype::Float32)?.reshape(&qkv_shape)?;
        let q_scale = ((self.head_dim as f64).powf(-0.5) / std::f64::consts::LN_2) as f32;
        let k_scale = ((1.0 + std::f64::consts::E).ln() / std::f64::consts::LN_2) as f32;
        let per_dim = logaddexp(&self.per_dim_scale, Array::from_int(0))?; // nn.softplus
        // `q_scale * softplus(per_dim_scale)` in the weight's dtype (a weak Python scalar).
        let q = q.multiply(scalar(q_scale, &per_dim)?.multiply(&per_dim)?)?;
        let k = k.multiply(Array::from_f32(k_scale))?;

        let q_blocks = self.to_blocks(&q)?;
        let k_blocks = self.block_context(&k)?;
        let v_blocks = self.block_context(&v)?;
        let u = q_blocks.dim(1);

        let valid: Vec<Vec<bool>> = invalid.iter().map(|r| r.iter().map(|&m| !m).collect()).collect();
        let valid_ctx = self.block_context(&mask_array(&valid, &[b, t])?)?; // [B, U, C], pads false
        let condition = valid_ctx
            .reshape(&[b, 1, u, 1, self.context])?
            .logical_and(&self.causal_valid.reshape(&[1, 1, 1, self.chunk, self.context])?)?;

        let logits = self.logits(&q_blocks, &k_blocks)?;
        let cap = Array::from_f32(self.softcap);
        let logits = tanh(&logits.divide(&cap)?)?.multiply(&cap)?;
        let logits = select(&condition, &logits, Array::from_f32(self.invalid_logit))?;
        let probs = softmax_axis(&logits, -1, None)?;
        let ctx = einsum("bnuwc,bucnh->buwnh", [&probs, &v_blocks])?;
        let ctx = ctx.reshape(&[b, u * self.chunk, self.heads, self.head_dim])?;
        let ctx = ctx.index((.., ..t));
        let ctx = ctx.reshape(&[b, t, self.heads * self.head_dim])?;
        self.post.forward(&ctx)
    }
}

fn pad_dim1(x: &Array, left: i32, right: i32) -> Result<Array> {
    let mut widths = vec![(0, 0); x.ndim()];
    widths[1] = (left, right);
    let value = if x.dtype() == Dtype::Bool { Array::from_bool(false) } else { Array::from_int(0).as_dtype(x.dtype())? };
    Ok(pad(x, &widths[..], value, None)?)
}

struct LightConv {
    pre_norm: RmsNorm,
    linear_start: ClippedLinear,
    depthwise: Array,
    conv_norm: RmsNorm,
    linear_end: ClippedLinear,
    kernel: i32,
    grad_clip: f32,
}

impl LightConv {
    fn load(w: &mut Weights, p: &str, c: &AudioConfig) -> Result<Self> {
        let d = c.hidden_size;
        let name = format!("{p}.depthwise_conv1d.weight");
        let mut depthwise = w.remove(&name).ok_or_else(|| Error::ModelLoad(format!("missing tensor {name:?}")))?;
        // PyTorch layout [D, 1, K] -> MLX [D, K, 1] (mlx-vlm's sanitize rule).
        if depthwise.ndim() == 3 && depthwise.dim(-1) != 1 {
            depthwise = depthwise.transpose_axes(&[0, 2, 1])?;
        }
        if depthwise.shape() != [d, c.conv_kernel_size, 1] {
            return Err(Error::ModelLoad(format!("tensor {name:?} has shape {:?}, expected [{d}, {}, 1]", depthwise.shape(), c.conv_kernel_size)));
        }
        Ok(LightConv {
            pre_norm: RmsNorm::load(w, &format!("{p}.pre_layer_norm"), d, c.rms_norm_eps)?,
            linear_start: ClippedLinear::load(w, &format!("{p}.linear_start"), d, d * 2, c.use_clipped_linears)?,
            depthwise,
            conv_norm: RmsNorm::load(w, &format!("{p}.conv_norm"), d, c.rms_norm_eps)?,
            linear_end: ClippedLinear::load(w, &format!("{p}.linear_end"), d, d, c.use_clipped_linears)?,
            kernel: c.conv_kernel_size,
            grad_clip: c.gradient_clipping,
        })
    }

    fn forward(&self, x: &Array) -> Result<Array> {
        let h = self.pre_norm.forward(x)?;
        let h = self.linear_start.forward(&h)?;
        let parts = split_equal(&h, 2, -1)?;
        let h = parts[0].multiply(sigmoid(&parts[1])?)?;
        let h = pad(&h, &[(0, 0), (self.kernel - 1, 0), (0, 0)][..], None, None)?;
        let groups = h.dim(-1);
        let h = conv_general(&h, &self.depthwise, &[1][..], &[0][..], None, None, groups, None)?;
        let h = clip_g(&h, self.grad_clip)?;
        let h = silu(&self.conv_norm.forward(&h)?)?;
        let h = self.linear_end.forward(&h)?;
        Ok(h.add(x)?)
    }
}

struct ConformerBlock {
    ff1: FeedForward,
    attn: ChunkedAttention,
    lconv: LightConv,
    ff2: FeedForward,
    norm_pre_attn: RmsNorm,
    norm_post_attn: RmsNorm,
    norm_out: RmsNorm,
    grad_clip: f32,
}

impl ConformerBlock {
    fn load(w: &mut Weights, p: &str, c: &AudioConfig) -> Result<Self> {
        let d = c.hidden_size;
        Ok(ConformerBlock {
            ff1: FeedForward::load(w, &format!("{p}.feed_forward1"), c)?,
            attn: ChunkedAttention::load(w, &format!("{p}.self_attn"), c)?,
            lconv: LightConv::load(w, &format!("{p}.lconv1d"), c)?,
            ff2: FeedForward::load(w, &format!("{p}.feed_forward2"), c)?,
            norm_pre_attn: RmsNorm::load(w, &format!("{p}.norm_pre_attn"), d, 1e-6)?,
            norm_post_attn: RmsNorm::load(w, &format!("{p}.norm_post_attn"), d, 1e-6)?,
            norm_out: RmsNorm::load(w, &format!("{p}.norm_out"), d, 1e-6)?,
            grad_clip: c.gradient_clipping,
        })
    }

    fn forward(&self, x: &Array, invalid: &[Vec<bool>]) -> Result<Array> {
        let x = self.ff1.forward(x)?;
        let h = clip_g(&x, self.grad_clip)?;
        let h = self.attn.forward(&self.norm_pre_attn.forward(&h)?, invalid)?;
        let h = clip_g(&h, self.grad_clip)?;
        let x = x.add(self.norm_post_attn.forward(&h)?)?;
        let (b, t) = (x.dim(0), x.dim(1));
        let valid: Vec<Vec<bool>> = invalid.iter().map(|r| r.iter().map(|&m| !m).collect()).collect();
        let x = x.multiply(mask_array(&valid, &[b, t, 1])?.as_dtype(x.dtype())?)?;
        let x = self.lconv.forward(&x)?;
        let x = self.ff2.forward(&x)?;
        self.norm_out.forward(&clip_g(&x, self.grad_clip)?)
    }
}

/// The audio tower plus `embed_audio`: log-mel features in, text-space soft tokens out.
pub struct Gemma4AudioTower {
    pub config: AudioConfig,
    pub text_hidden_size: i32,
    sscp: [SscpBlock; 2],
    input_proj: Linear,
    layers: Vec<ConformerBlock>,
    output_proj: Option<Linear>,
    embed_projection: Linear,
    embed_eps: f32,
}

/// What the tower returns for a batch of clips.
pub struct AudioEncoding {
    /// `[B, T', text_hidden]`: the embedder's output, padding frames zero.
    pub embeddings: Array,
    /// `[B, T', output_proj_dims]`: the tower's output before the embedder.
    pub tower: Array,
    /// `invalid[b][t]`: frame t of clip b is padding.
    pub invalid: Vec<Vec<bool>>,
}

impl Gemma4AudioTower {
    /// Loads from a Gemma 4 directory: `config.json` (`audio_config`, `text_config.hidden_size`)
    /// and the `audio_tower.*` / `embed_audio.*` tensors of its `*.safetensors` files (mlx-vlm
    /// layout; a leading `model.` and PyTorch conv layouts are accepted as mlx-vlm's sanitize
    /// accepts them). Tensors keep their stored dtype; the layers compute as `options` says
    /// (`LayerOptions::default()`: fast kernels on the CPU; exact mode matches mlx-vlm bit for bit).
    pub fn load(dir: &Path, options: &crate::nn::LayerOptions) -> Result<Self> {
        let cfg_path = dir.join("config.json");
        let text = std::fs::read_to_string(&cfg_path).map_err(|e| Error::io(&cfg_path, e))?;
        let cfg: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| Error::ModelLoad(format!("{}: {e}", cfg_path.display())))?;
        let audio = cfg
            .get("audio_config")
            .filter(|v| !v.is_null())
            .ok_or_else(|| Error::Unsupported(format!("{}: no audio_config (the model has no audio tower)", dir.display())))?;
        let config: AudioConfig =
            serde_json::from_value(audio.clone()).map_err(|e| Error::ModelLoad(format!("audio_config: {e}")))?;
        let text_hidden_size = cfg
            .pointer("/text_config/hidden_size")
            .or_else(|| cfg.get("hidden_size"))
            .and_then(|v| v.as_i64())
            .ok_or_else(|| Error::ModelLoad("config.json: no text_config.hidden_size".into()))? as i32;

        let mut tensors = HashMap::new();
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .map_err(|e| Error::io(dir, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        files.sort();
        for f in files {
            let all = Array::load_safetensors(&f).map_err(|e| Error::ModelLoad(format!("{}: {e}", f.display())))?;
            for (k, v) in all {
                let k = k.strip_prefix("model.").map(str::to_string).unwrap_or(k);
                if k.starts_with("audio_tower.") || k.starts_with("embed_audio.") {
                    tensors.insert(k, v);
                }
            }
        }
        if tensors.is_empty() {
            return Err(Error::ModelLoad(format!("{}: no audio_tower.* tensors", dir.display())));
        }
        let mut w = Weights::new(tensors, None).with_options(options.clone());
        Self::from_weights(&mut w, config, text_hidden_size).and_then(|t| w.finish().map(|_| t))
    }

    /// Builds the tower from `audio_tower.*` / `embed_audio.*` tensors.
    pub fn from_weights(w: &mut Weights, config: AudioConfig, text_hidden_size: i32) -> Result<Self> {
        let c = &config;
        if c.hidden_act != "silu" {
            return Err(Error::Unsupported(format!("audio_config.hidden_act {:?}", c.hidden_act)));
        }
        if c.subsampling_conv_channels.len() != 2 || c.hidden_size % c.num_attention_heads != 0 {
            return Err(Error::ModelLoad("audio_config: expected two subsampling_conv_channels and heads dividing hidden_size".into()));
        }
        let ch = &c.subsampling_conv_channels;
        let mut block = |idx: usize| -> Result<SscpBlock> {
            let in_ch = if idx == 0 { 1 } else { ch[idx - 1] };
            let name = format!("audio_tower.subsample_conv_projection.layer{idx}.conv.weight");
            let mut conv = w.remove(&name).ok_or_else(|| Error::ModelLoad(format!("missing tensor {name:?}")))?;
            // PyTorch layout [out, in, kH, kW] -> MLX [out, kH, kW, in] (mlx-vlm's sanitize rule).
            if conv.ndim() == 4 && conv.dim(-1) != in_ch {
                conv = conv.transpose_axes(&[0, 2, 3, 1])?;
            }
            if conv.shape() != [ch[idx], 3, 3, in_ch] {
                return Err(Error::ModelLoad(format!("tensor {name:?} has shape {:?}, expected [{}, 3, 3, {in_ch}]", conv.shape(), ch[idx])));
            }
            let norm = w.take(&format!("audio_tower.subsample_conv_projection.layer{idx}.norm.weight"), &[ch[idx]])?;
            Ok(SscpBlock { conv, norm, eps: c.rms_norm_eps })
        };
        let sscp = [block(0)?, block(1)?];
        let mut freq = INPUT_FEAT_SIZE;
        for _ in 0..2 {
            freq = (freq + 2 - 3) / 2 + 1;
        }
        let input_proj = Linear::load(w, "audio_tower.subsample_conv_projection.input_proj_linear", freq * ch[1], c.hidden_size, false)?;
        let layers = (0..c.num_hidden_layers)
            .map(|i| ConformerBlock::load(w, &format!("audio_tower.layers.{i}"), c))
            .collect::<Result<Vec<_>>>()?;
        let output_proj = match c.output_proj_dims {
            Some(o) => Some(Linear::load(w, "audio_tower.output_proj", c.hidden_size, o, true)?),
            None => None,
        };
        let out_dim = c.output_proj_dims.unwrap_or(c.hidden_size);
        let embed_projection = Linear::load(w, "embed_audio.embedding_projection", out_dim, text_hidden_size, false)?;
        Ok(Gemma4AudioTower { embed_eps: c.rms_norm_eps, config, text_hidden_size, sscp, input_proj, layers, output_proj, embed_projection })
    }

    /// Soft tokens of a batch of clips. `features`: `[B, T, 128]` log-mel (padding frames
    /// zero); `invalid[b][t]`: frame t of clip b is padding (the inverse of the extractor's
    /// `input_features_mask`).
    pub fn encode(&self, features: &Array, invalid: &[Vec<bool>]) -> Result<AudioEncoding> {
        if features.ndim() != 3 || features.dim(2) != INPUT_FEAT_SIZE {
            return Err(Error::InvalidRequest(format!("audio tower: features {:?}, expected [B, T, {INPUT_FEAT_SIZE}]", features.shape())));
        }
        let (b, t) = (features.dim(0) as usize, features.dim(1) as usize);
        if invalid.len() != b || invalid.iter().any(|r| r.len() != t) {
            return Err(Error::InvalidRequest("audio tower: the mask does not match the features".into()));
        }
        if t < crate::audio::MIN_MEL_FRAMES {
            let min = crate::audio::MIN_MEL_FRAMES;
            return Err(Error::InvalidRequest(format!("audio tower: {t} mel frames; at least {min} are needed")));
        }
        let x = features.expand_dims(-1)?;
        let (x, m) = self.sscp[0].forward(&x, invalid)?;
        let (x, m) = self.sscp[1].forward(&x, &m)?;
        let (bb, tt, f, ch) = (x.dim(0), x.dim(1), x.dim(2), x.dim(3));
        let mut h = self.input_proj.forward(&x.reshape(&[bb, tt, f * ch])?)?;
        for layer in &self.layers {
            h = layer.forward(&h, &m)?;
        }
        if let Some(p) = &self.output_proj {
            h = p.forward(&h)?;
        }
        let tower = select(&mask_array(&m, &[bb, tt, 1])?, &scalar(0.0, &h)?, &h)?;
        let normed = mlx_rs::fast::rms_norm(&tower, None, self.embed_eps)?;
        let embeddings = self.embed_projection.forward(&normed)?;
        Ok(AudioEncoding { embeddings, tower, invalid: m })
    }

    /// One clip's soft tokens (`[rows, text_hidden]`) from its mel features.
    pub fn encode_clip(&self, mel: &crate::audio::MelFeatures) -> Result<Array> {
        let features = Array::from_slice(&mel.data, &[1, mel.frames as i32, mel.bins as i32]);
        let invalid = vec![mel.valid.iter().map(|&v| !v).collect::<Vec<bool>>()];
        let enc = self.encode(&features, &invalid)?;
        Ok(enc.embeddings.index(0))
    }
}

/// One clip ready to splice: its soft tokens and how many prompt positions they fill.
pub struct AudioClip {
    /// `[rows, text_hidden]`, the embedder's output.
    pub soft: Array,
    /// `n = min(ceil(ms / 40), 750)`: the `<|audio|>` positions between `boa` and `eoa`.
    pub soft_tokens: usize,
    pub seconds: f64,
}

impl AudioClip {
    /// `[soft_tokens, text_hidden]`: what the clip's `soft_tokens` positions receive, in order
    /// (row i is the tower's row `i % rows`, the reference's wrap-around), for a seam that
    /// splices one contiguous span per clip.
    pub fn span_embeddings(&self) -> Result<Array> {
        let rows = self.soft.dim(0);
        let idx: Vec<i32> = (0..self.soft_tokens as i32).map(|i| i % rows).collect();
        Ok(take_axis(&self.soft, Array::from_slice(&idx, &[idx.len() as i32]), 0)?)
    }
}

/// Everything audio input needs for one Gemma 4 checkpoint: the frontend (with the
/// checkpoint's extractor settings), the tower and the token rule. The seam for the engine:
/// `expand_prompt` gives the prompt ids, `splice` puts the clips into its token embeddings
/// (before the text model runs on embeddings; the per-layer inputs of audio positions use id 0,
/// as in mlx-vlm's `get_input_embeddings`).
pub struct Gemma4Audio {
    pub tower: Gemma4AudioTower,
    pub frontend: std::sync::Arc<crate::audio::MelFrontend>,
    pub tokens: crate::audio::AudioTokens,
    /// What the engine's admission reads (frontend, tokens as loaded, clip limit).
    spec: crate::audio::AudioSpec,
}

impl Gemma4Audio {
    /// From a Gemma 4 directory: `config.json`, the tensors, and the feature extractor's fields
    /// from `processor_config.json` or `preprocessor_config.json` when present
    /// ([`crate::audio::MelConfig::from_processor_configs`]).
    pub fn load(dir: &Path, options: &crate::nn::LayerOptions) -> Result<Self> {
        let tower = Gemma4AudioTower::load(dir, options)?;
        let cfg_path = dir.join("config.json");
        let text = std::fs::read_to_string(&cfg_path).map_err(|e| Error::io(&cfg_path, e))?;
        let cfg: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| Error::ModelLoad(format!("{}: {e}", cfg_path.display())))?;
        let mel = crate::audio::MelConfig::from_processor_configs(crate::vision::read_processor_configs(dir)?.as_ref())?;
        Self::assemble(tower, mel, &cfg)
    }

    /// From a loaded Gemma 4 checkpoint's `config.json` and its `audio_tower.*` /
    /// `embed_audio.*` tensors (the model loader's path; the extractor's settings from the
    /// processor configs the loader put beside them, else mlx-vlm's defaults).
    /// `None` when the config has no `audio_config` or the tensors are absent (a stripped tower).
    pub fn from_checkpoint(cfg: &serde_json::Value, w: &mut Weights) -> Result<Option<Self>> {
        let Some(audio) = cfg.get("audio_config").filter(|v| !v.is_null()) else { return Ok(None) };
        w.rename_prefix("model.audio_tower.", "audio_tower.");
        w.rename_prefix("model.embed_audio.", "embed_audio.");
        let mut tw = w.split_prefixes(&["audio_tower.", "embed_audio."]);
        if !tw.contains("audio_tower.subsample_conv_projection.layer0.conv.weight") {
            return Ok(None);
        }
        let config: AudioConfig =
            serde_json::from_value(audio.clone()).map_err(|e| Error::ModelLoad(format!("audio_config: {e}")))?;
        let text_hidden = cfg
            .pointer("/text_config/hidden_size")
            .or_else(|| cfg.get("hidden_size"))
            .and_then(|v| v.as_i64())
            .ok_or_else(|| Error::ModelLoad("config.json: no text_config.hidden_size".into()))? as i32;
        let tower = Gemma4AudioTower::from_weights(&mut tw, config, text_hidden)?;
        tw.finish()?;
        let mel = crate::audio::MelConfig::from_processor_configs(cfg.get(crate::vision::PROCESSOR_CONFIG_KEY))?;
        Self::assemble(tower, mel, cfg).map(Some)
    }

    fn assemble(tower: Gemma4AudioTower, mel: crate::audio::MelConfig, cfg: &serde_json::Value) -> Result<Self> {
        if mel.feature_size != INPUT_FEAT_SIZE as usize || mel.sampling_rate != crate::audio::SAMPLE_RATE {
            return Err(Error::Unsupported(format!(
                "audio feature extractor: {} bins at {} Hz (the tower takes {INPUT_FEAT_SIZE} at {})",
                mel.feature_size,
                mel.sampling_rate,
                crate::audio::SAMPLE_RATE
            )));
        }
        let frontend = std::sync::Arc::new(crate::audio::MelFrontend::new(mel)?);
        let tokens = crate::audio::AudioTokens::from_config(cfg);
        let spec = crate::audio::AudioSpec {
            frontend: frontend.clone(),
            tokens,
            max_clips: crate::limits::MAX_AUDIO_CLIPS,
            min_frames: crate::audio::MIN_MEL_FRAMES,
        };
        Ok(Gemma4Audio { tower, frontend, tokens, spec })
    }

    /// Audio bytes (WAV / MP3 / FLAC / Ogg Vorbis, at most 30 s) -> soft tokens.
    pub fn prepare_clip(&self, bytes: &[u8], format_hint: Option<&str>) -> Result<AudioClip> {
        let wav = crate::audio::load_clip(bytes, format_hint)?;
        let mel = self.spec.features(&wav)?;
        let soft = self.tower.encode_clip(&mel)?;
        soft.eval()?;
        Ok(AudioClip {
            soft,
            soft_tokens: self.tokens.soft_token_count(wav.len(), crate::audio::SAMPLE_RATE),
            seconds: wav.len() as f64 / crate::audio::SAMPLE_RATE as f64,
        })
    }

    /// The chat template's ids with each `<|audio|>` expanded to `boa + audio x n + eoa`.
    pub fn expand_prompt(&self, ids: &[u32], clips: &[AudioClip]) -> Result<Vec<u32>> {
        let counts: Vec<usize> = clips.iter().map(|c| c.soft_tokens).collect();
        crate::audio::expand_audio_placeholders(ids, &counts, &self.tokens)
    }

    /// `embeds` (`[len, hidden]`, the expanded prompt's token embeddings, already scaled as the
    /// text model scales them) with the clips' soft tokens at the audio positions.
    pub fn splice(&self, embeds: &Array, expanded_ids: &[u32], clips: &[AudioClip]) -> Result<Array> {
        let soft: Vec<Array> = clips.iter().map(|c| c.soft.clone()).collect();
        crate::audio::splice_soft_tokens(embeds, expanded_ids, &soft, &self.tokens)
    }
}

impl crate::audio::AudioTower for Gemma4Audio {
    fn spec(&self) -> &crate::audio::AudioSpec {
        &self.spec
    }

    fn encode(&self, mel: &crate::audio::MelFeatures, soft_tokens: usize) -> Result<Array> {
        let soft = self.tower.encode_clip(mel)?;
        AudioClip { soft, soft_tokens, seconds: 0.0 }.span_embeddings()
    }
}
