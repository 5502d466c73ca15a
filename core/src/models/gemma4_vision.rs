//! Gemma 4's vision tower and its embedder, as mlx-vlm `models/gemma4` (vision.py,
//! gemma4.py) has them, tensors `vision_tower.*` and `embed_vision.*`:
//! - patches of `patch x patch x 3` pixels (row, column, channel order), `2 * (x - 0.5)`,
//!   `patch_embedder.input_proj`, plus the x and y rows of `position_embedding_table`;
//! - encoder blocks: RMSNorm (stored weight) around attention and a GeGLU MLP, both with
//!   clippable linears (`use_clipped_linears`); q/k RMS norms and a scale-free v norm computed
//!   in f32 op by op, 2-D RoPE (half the head rotates by the patch column, half by its row,
//!   theta from `rope_parameters`), attention scale 1, unmasked, head_dim zero-padded to a
//!   fused size (64 / 80 / 128) as mlx-vlm's `ensure_fused_sdpa` does;
//! - pooling: each `pooling x pooling` block of patches averaged (mlx-vlm's one-hot einsum),
//!   times `sqrt(hidden)`, then `(x - std_bias) * std_scale` when `standardize`;
//! - `embed_vision`: scale-free RMSNorm, then a projection to the text width. Those soft
//!   tokens replace the text model's SCALED embeddings (no division as in Gemma 3).
//! Image preprocessing is [`Sizing::PatchBudget`]: the soft-token count depends on the image
//! size, at most `vision_soft_tokens_per_image` (mlx-vlm's processor `max_soft_tokens`).

use mlx_rs::ops::{concatenate, einsum, pad};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype};

use super::gemma4_audio::ClippedLinear;
use super::ConfigReader;
use crate::nn::{gelu_approx, Linear, RmsNorm, Weights};
use crate::vision::{ImageMarker, ImageProcessor, ImageSpec, Resample, Sizing, VisionTower};
use crate::{Error, Result};

struct VisionConfig {
    hidden: i32,
    intermediate: i32,
    layers: usize,
    heads: i32,
    kv_heads: i32,
    head_dim: i32,
    eps: f32,
    patch: i32,
    positions: i32,
    pooling: i32,
    rope_theta: f32,
    clipped: bool,
    standardize: bool,
}

struct Block {
    q: ClippedLinear,
    k: ClippedLinear,
    v: ClippedLinear,
    o: ClippedLinear,
    q_norm: Array,
    k_norm: Array,
    gate: ClippedLinear,
    up: ClippedLinear,
    down: ClippedLinear,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    pre_feedforward_layernorm: RmsNorm,
    post_feedforward_layernorm: RmsNorm,
}

pub struct Gemma4Vision {
    cfg: VisionConfig,
    input_proj: Linear,
    /// `[2, positions, hidden]`: x (column) then y (row) tables.
    position_table: Array,
    blocks: Vec<Block>,
    standardize: Option<(Array, Array)>,
    embed_proj: Linear,
    /// `embed_vision`'s norm eps (the vision config's `rms_norm_eps`).
    embed_eps: f32,
    spec: ImageSpec,
}

/// Whether a `gemma4` checkpoint carries a vision tower (mlx-vlm layout).
pub fn present(cfg: &ConfigReader, w: &Weights) -> bool {
    cfg.get("vision_config").is_some_and(|v| v.is_object())
        && w.contains("vision_tower.patch_embedder.input_proj.weight")
        && w.contains("embed_vision.embedding_projection.weight")
}

fn int(v: &ConfigReader, key: &str, default: i32) -> Result<i32> {
    let x = v.opt_i32(key)?.unwrap_or(default);
    if x <= 0 {
        return Err(Error::ModelLoad(format!("config.json: vision_config {key:?} must be positive, got {x}")));
    }
    Ok(x)
}

/// Loads the tower and embedder from `vision_tower.*` / `embed_vision.*` (mlx-vlm defaults for
/// absent keys); `text_hidden` is the text model's width, `dtype` the checkpoint's.
pub fn load(cfg: &ConfigReader, w: &mut Weights, text_hidden: i32, _dtype: Dtype) -> Result<Gemma4Vision> {
    let vraw = cfg.get("vision_config").cloned().unwrap_or_default();
    let v = ConfigReader::new(&vraw);
    let theta = match v.get("rope_parameters").and_then(|p| p.get("rope_theta")) {
        None => 100.0,
        Some(t) => t
            .as_f64()
            .ok_or_else(|| Error::ModelLoad(format!("config.json: vision rope_theta must be a number, got {t}")))?,
    };
    let c = VisionConfig {
        hidden: int(&v, "hidden_size", 768)?,
        intermediate: int(&v, "intermediate_size", 3072)?,
        layers: int(&v, "num_hidden_layers", 16)? as usize,
        heads: int(&v, "num_attention_heads", 12)?,
        kv_heads: int(&v, "num_key_value_heads", 12)?,
        head_dim: int(&v, "head_dim", 64)?,
        eps: v.f32_or("rms_norm_eps", 1e-6)?,
        patch: int(&v, "patch_size", 16)?,
        positions: int(&v, "position_embedding_size", 10240)?,
        pooling: int(&v, "pooling_kernel_size", 3)?,
        rope_theta: theta as f32,
        clipped: v.bool_or("use_clipped_linears", false)?,
        standardize: v.bool_or("standardize", false)?,
    };
    if c.heads != c.kv_heads || c.head_dim % 4 != 0 {
        return Err(Error::Unsupported(format!(
            "gemma4 vision: {} query heads over {} key/value heads, head_dim {} (equal head counts and a head_dim divisible by 4 only)",
            c.heads, c.kv_heads, c.head_dim
        )));
    }
 if !c.clipped {
        // mlx-vlm sanitize drops the vision tower's clip bounds when they are unused.
        for suffix in ["input_min", "input_max", "output_min", "output_max"] {
            w.ignore_suffix(suffix);
        }
    }
    let (d, hd) = (c.hidden, c.head_dim);
    let pe = "vision_tower.patch_embedder";
    let input_proj = Linear::load(w, &format!("{pe}.input_proj"), 3 * c.patch * c.patch, d, false)?;
    let position_table = w.take(&format!("{pe}.position_embedding_table"), &[2, c.positions, d])?;
    let mut blocks = Vec::with_capacity(c.layers);
    for i in 0..c.layers {
        let p = format!("vision_tower.encoder.layers.{i}");
        let lin = |w: &mut Weights, name: &str, i: i32, o: i32| ClippedLinear::load(w, &format!("{p}.{name}"), i, o, c.clipped);
        let norm = |w: &mut Weights, name: &str| RmsNorm::load(w, &format!("{p}.{name}"), d, c.eps);
        blocks.push(Block {
            q: lin(w, "self_attn.q_proj", d, c.heads * hd)?,
            k: lin(w, "self_attn.k_proj", d, c.kv_heads * hd)?,
            v: lin(w, "self_attn.v_proj", d, c.kv_heads * hd)?,
            o: lin(w, "self_attn.o_proj", c.heads * hd, d)?,
            q_norm: w.take(&format!("{p}.self_attn.q_norm.weight"), &[hd])?,
            k_norm: w.take(&format!("{p}.self_attn.k_norm.weight"), &[hd])?,
            gate: lin(w, "mlp.gate_proj", d, c.intermediate)?,
            up: lin(w, "mlp.up_proj", d, c.intermediate)?,
            down: lin(w, "mlp.down_proj", c.intermediate, d)?,
            input_layernorm: norm(w, "input_layernorm")?,
            post_attention_layernorm: norm(w, "post_attention_layernorm")?,
            pre_feedforward_layernorm: norm(w, "pre_feedforward_layernorm")?,
            post_feedforward_layernorm: norm(w, "post_feedforward_layernorm")?,
        });
    }
    let standardize = if c.standardize {
        Some((w.take("vision_tower.std_bias", &[d])?, w.take("vision_tower.std_scale", &[d])?))
    } else {
        None
    };
    let embed_proj = Linear::load(w, "embed_vision.embedding_projection", d, text_hidden, false)?;
    let token = |key: &str, default: i64| -> Result<u32> {
        let v = cfg.get(key).and_then(|v| v.as_i64()).unwrap_or(default);
        u32::try_from(v).map_err(|_| Error::ModelLoad(format!("config.json: {key:?} must be a token id")))
    };
    let max_tokens = cfg.opt_i32("vision_soft_tokens_per_image")?.unwrap_or(280);
    if max_tokens <= 0 {
        return Err(Error::ModelLoad("config.json: vision_soft_tokens_per_image must be positive".into()));
    }
    let (patch, pooling) = (c.patch as usize, c.pooling as usize);
    let max_patches = max_tokens as usize * pooling * pooling;
    let largest = (max_patches as f64).sqrt() as usize * patch;
    let spec = ImageSpec {
        processor: ImageProcessor {
            height: largest,
            width: largest,
            resample: Resample::Bicubic,
            rescale_factor: 1.0 / 255.0,
            mean: [0.0; 3],
            std: [1.0; 3],
            sizing: Sizing::PatchBudget { patch, max_patches, pooling },
            pan_and_scan: None,
        },
        image_token_id: token("image_token_id", 258_880)?,
        tokens_per_image: max_tokens as usize,
        begin_token_id: Some(token("boi_token_id", 255_999)?),
        end_token_id: Some(token("eoi_token_id", 258_882)?),
        zeroed_token_id: None,
        max_images: 8,
        marker: ImageMarker::ImageToken,
        bidirectional: bidirectional(cfg)?,
    };
    let embed_eps = c.eps;
    Ok(Gemma4Vision { cfg: c, input_proj, position_table, blocks, standardize, embed_proj, embed_eps, spec })
}

/// `text_config.use_bidirectional_attention == "vision"`: image spans attend both ways.
pub fn bidirectional(cfg: &ConfigReader) -> Result<bool> {
    Ok(match cfg.get("text_config").and_then(|t| t.get("use_bidirectional_attention")) {
        None => false,
        Some(serde_json::Value::String(s)) => s == "vision",
        Some(serde_json::Value::Null) => false,
        Some(other) => {
            return Err(Error::Unsupported(format!("gemma4: use_bidirectional_attention {other} (only \"vision\")")))
        }
    })
}

/// `x` in f32: `x * rsqrt(mean(x^2) + eps)` (times `weight`), back in x's dtype, op for op as
/// mlx-vlm's VisionRMSNorm (not the fused kernel).
fn rms_norm_f32(x: &Array, weight: Option<&Array>, eps: f32) -> Result<Array> {
    let xf = x.as_dtype(Dtype::Float32)?;
    let var = xf.power(&Array::from_f32(2.0))?.mean_axes(&[-1], true)?;
    let normed = xf.multiply(&var.add(&Array::from_f32(eps))?.rsqrt()?)?;
    let out = match weight {
        Some(w) => normed.multiply(w.as_dtype(Dtype::Float32)?)?,
        None => normed,
    };
    Ok(out.as_dtype(x.dtype())?)
}

fn rotate_half(x: &Array) -> Result<Array> {
    let half = x.dim(-1) / 2;
    let x1 = x.index((.., .., .., ..half));
    let x2 = x.index((.., .., .., half..));
    Ok(concatenate(&[x2.negative()?, x1], -1)?)
}

impl Gemma4Vision {
    /// mlx-vlm `apply_multidimensional_rope` for `[B, L, heads, head_dim]` with per-patch
    /// `(x, y)` positions `[L, 2]` (f32).
    fn rope(&self, x: &Array, positions: &Array) -> Result<Array> {
        let hd = x.dim(-1);
        let per = 2 * (hd / 4);
        let half = per / 2;
        let exps = Array::from_iter(0..half, &[half]).as_dtype(Dtype::Float32)?.multiply(Array::from_f32((2.0 / per as f64) as f32))?;
        let timescale = mlx_rs::ops::power(&Array::from_f32(self.cfg.rope_theta), &exps)?;
        let mut parts = Vec::with_capacity(2);
        for d in 0..2 {
            let part = x.index((.., .., .., d * per..(d + 1) * per));
            let arg = positions.index((.., d..d + 1)).divide(&timescale)?;
            let (cos, sin) = (mlx_rs::ops::cos(&arg)?, mlx_rs::ops::sin(&arg)?);
            let cos = concatenate(&[cos.clone(), cos], -1)?.as_dtype(x.dtype())?.reshape(&[1, -1, 1, per])?;
            let sin = concatenate(&[sin.clone(), sin], -1)?.as_dtype(x.dtype())?.reshape(&[1, -1, 1, per])?;
            parts.push(part.multiply(&cos)?.add(&rotate_half(&part)?.multiply(&sin)?)?);
        }
        Ok(concatenate(&parts, -1)?)
    }

    fn attention(&self, b: &Block, x: &Array, positions: &Array) -> Result<Array> {
        let (bsz, l) = (x.dim(0), x.dim(1));
        let (h, hd) = (self.cfg.heads, self.cfg.head_dim);
        let q = rms_norm_f32(&b.q.forward(x)?.reshape(&[bsz, l, h, hd])?, Some(&b.q_norm), 1e-6)?;
        let k = rms_norm_f32(&b.k.forward(x)?.reshape(&[bsz, l, h, hd])?, Some(&b.k_norm), 1e-6)?;
        let v = rms_norm_f32(&b.v.forward(x)?.reshape(&[bsz, l, h, hd])?, None, 1e-6)?;
        let q = self.rope(&q, positions)?.transpose_axes(&[0, 2, 1, 3])?;
        let k = self.rope(&k, positions)?.transpose_axes(&[0, 2, 1, 3])?;
        let v = v.transpose_axes(&[0, 2, 1, 3])?;
        // mlx-vlm ensure_fused_sdpa: zero-pad head_dim up to 64 / 80 / 128.
        let target = [64, 80, 128].into_iter().find(|&t| hd <= t).unwrap_or(hd);
        let o = if target == hd {
            mlx_rs::fast::scaled_dot_product_attention(&q, &k, &v, 1.0, None, None)?
        } else {
            let widths = [(0, 0), (0, 0), (0, 0), (0, target - hd)];
            let padded = |t: &Array| -> Result<Array> {
                Ok(pad(t, &widths, Array::from_f32(0.0).as_dtype(t.dtype())?, None)?)
            };
            let o = mlx_rs::fast::scaled_dot_product_attention(&padded(&q)?, &padded(&k)?, &padded(&v)?, 1.0, None, None)?;
            o.index((.., .., .., ..hd))
        };
        let o = o.transpose_axes(&[0, 2, 1, 3])?.reshape(&[bsz, l, -1])?;
        b.o.forward(&o)
    }

    /// Tower + embedder: `[B, H, W, 3]` pixel values in `[0, 1]` → `[B, n, text hidden]`.
    pub fn soft_tokens(&self, pixels: &Array) -> Result<Array> {
        let (bsz, hgt, wid) = (pixels.dim(0), pixels.dim(1), pixels.dim(2));
        let p = self.cfg.patch;
        let k = self.cfg.pooling;
        if hgt % (p * k) != 0 || wid % (p * k) != 0 {
            return Err(Error::InvalidRequest(format!(
                "gemma4 vision: a {wid}x{hgt} image (sides must be multiples of {})",
                p * k
            )));
        }
        let (ph, pw) = (hgt / p, wid / p);
        if ph.max(pw) > self.cfg.positions {
            return Err(Error::InvalidRequest(format!("gemma4 vision: {pw}x{ph} patches exceed the position table")));
        }
        let n = ph * pw;
        let patches = pixels
            .as_dtype(Dtype::Float32)?
            .reshape(&[bsz, ph, p, pw, p, 3])?
            .transpose_axes(&[0, 1, 3, 2, 4, 5])?
            .reshape(&[bsz, n, p * p * 3])?;
        let patches = patches.subtract(Array::from_f32(0.5))?.multiply(Array::from_f32(2.0))?;
        let dtype = self.position_table.dtype();
        let x = self.input_proj.forward(&patches.as_dtype(dtype)?)?;
        // Patch (x, y) = (column, row), row-major.
        let cols: Vec<i32> = (0..n).map(|i| i % pw).collect();
        let rows: Vec<i32> = (0..n).map(|i| i / pw).collect();
        let (cols, rows) = (Array::from_slice(&cols, &[n]), Array::from_slice(&rows, &[n]));
        // The one-hot matmul of mlx-vlm picks table rows exactly: a gather, then x + y.
        let px = self.position_table.index(0).take_axis(&cols, 0)?;
        let py = self.position_table.index(1).take_axis(&rows, 0)?;
        let mut h = x.add(&px.add(&py)?)?;
        let positions = concatenate(&[cols.reshape(&[n, 1])?, rows.reshape(&[n, 1])?], 1)?.as_dtype(Dtype::Float32)?;
        for b in &self.blocks {
            let a = self.attention(b, &b.input_layernorm.forward(&h)?, &positions)?;
            h = h.add(&b.post_attention_layernorm.forward(&a)?)?;
            let m = b.pre_feedforward_layernorm.forward(&h)?;
            let m = b.down.forward(&gelu_approx(&b.gate.forward(&m)?)?.multiply(&b.up.forward(&m)?)?)?;
            h = h.add(&b.post_feedforward_layernorm.forward(&m)?)?;
        }
        // Pooling by position: block (x / k, y / k), one-hot / k^2 weights, mlx-vlm's einsum.
        let len = n / (k * k);
        let h = if len == n {
            h
        } else {
            let per_row = pw / k;
            let mut weights = vec![0f32; (n * len) as usize];
            let w = 1.0f32 / (k * k) as f32;
            for i in 0..n {
                let block = (i % pw) / k + per_row * ((i / pw) / k);
                weights[(i * len + block) as usize] = w;
            }
            let weights = Array::from_slice(&weights, &[1, n, len]);
            let weights = mlx_rs::ops::broadcast_to(&weights, &[bsz, n, len])?;
            einsum("bLl,bLd->bld", [&weights, &h])?.as_dtype(h.dtype())?
        };
        let root = Array::from_f32((self.cfg.hidden as f64).sqrt() as f32).as_dtype(h.dtype())?;
        let mut h = h.multiply(&root)?;
        if let Some((bias, scale)) = &self.standardize {
            h = h.subtract(bias)?.multiply(scale)?;
        }
        let h = mlx_rs::fast::rms_norm(&h, None, self.embed_eps)?;
        self.embed_proj.forward(&h)
    }
}

impl VisionTower for Gemma4Vision {
    fn spec(&self) -> &ImageSpec {
        &self.spec
    }

    fn encode(&self, pixels: &Array) -> Result<Array> {
        self.soft_tokens(pixels)
    }
}
