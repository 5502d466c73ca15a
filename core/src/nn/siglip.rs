//! The SigLIP vision tower as mlx-vlm builds it (`models/<family>/vision.py`, tensors under
//! `vision_tower.vision_model.`): a strided conv patch embedding plus learned position
//! embeddings, pre-norm encoder layers (LayerNorm, multi-head attention with biases and no
//! mask, LayerNorm, fc1 → tanh-approximated GELU → fc2), then `post_layernorm` (eps 1e-5,
//! mlx's default: the config's `layer_norm_eps` only reaches the encoder norms).

use mlx_rs::Array;

use crate::nn::{gelu_approx, Linear, Weights};
use crate::{Error, Result};

#[derive(Debug, Clone)]
pub struct SiglipConfig {
    pub hidden: i32,
    pub layers: usize,
    pub heads: i32,
    pub intermediate: i32,
    pub patch: i32,
    pub image_size: i32,
    pub channels: i32,
    pub eps: f32,
}

impl SiglipConfig {
    pub fn patches_per_side(&self) -> i32 {
        self.image_size / self.patch
    }
}

struct LayerNorm {
    weight: Array,
    bias: Array,
    eps: f32,
}

impl LayerNorm {
    fn load(w: &mut Weights, prefix: &str, dim: i32, eps: f32) -> Result<Self> {
        Ok(LayerNorm {
            weight: w.take(&format!("{prefix}.weight"), &[dim])?,
            bias: w.take(&format!("{prefix}.bias"), &[dim])?,
            eps,
        })
    }

    fn forward(&self, x: &Array) -> Result<Array> {
        Ok(mlx_rs::fast::layer_norm(x, Some(&self.weight), Some(&self.bias), self.eps)?)
    }
}

struct EncoderLayer {
    q: Linear,
    k: Linear,
    v: Linear,
    out: Linear,
    norm1: LayerNorm,
    norm2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

pub struct Siglip {
    cfg: SiglipConfig,
    /// `[out, kh, kw, in]` (MLX's conv layout).
    patch_weight: Array,
    patch_bias: Array,
    positions: Array,
    layers: Vec<EncoderLayer>,
    post_layernorm: LayerNorm,
}

impl Siglip {
    /// Loads from `prefix` (e.g. `vision_tower.vision_model`). A patch kernel in PyTorch's
    /// `[out, in, kh, kw]` layout is transposed, by mlx-vlm's shape rule.
    pub fn load(w: &mut Weights, prefix: &str, cfg: SiglipConfig) -> Result<Self> {
        let (d, p, c) = (cfg.hidden, cfg.patch, cfg.channels);
        let name = format!("{prefix}.embeddings.patch_embedding.weight");
        let raw = w.remove(&name).ok_or_else(|| Error::ModelLoad(format!("missing tensor {name:?}")))?;
        let shape = raw.shape().to_vec();
        // mlx-vlm check_array_shape: [out, kh, kw, in] when out >= kh, out >= kw and kh == kw.
        let mlx_layout = shape.len() == 4 && shape[0] >= shape[1] && shape[0] >= shape[2] && shape[1] == shape[2];
        let patch_weight = if mlx_layout { raw } else { raw.transpose_axes(&[0, 2, 3, 1])? };
        // Materialize now: the tower runs on the engine's thread, not the loader's stream.
        patch_weight.eval()?;
        if patch_weight.shape() != [d, p, p, c] {
            return Err(Error::ModelLoad(format!("{name}: shape {shape:?}, expected [{d}, {p}, {p}, {c}] (or [{d}, {c}, {p}, {p}])")));
        }
        let e = format!("{prefix}.embeddings");
        let patch_bias = w.take(&format!("{e}.patch_embedding.bias"), &[d])?;
        let n = cfg.patches_per_side() * cfg.patches_per_side();
        let positions = w.take(&format!("{e}.position_embedding.weight"), &[n, d])?;
        let mut layers = Vec::with_capacity(cfg.layers);
        for i in 0..cfg.layers {
            let l = format!("{prefix}.encoder.layers.{i}");
            let lin = |w: &mut Weights, name: &str, i: i32, o: i32| Linear::load(w, &format!("{l}.{name}"), i, o, true);
            layers.push(EncoderLayer {
                q: lin(w, "self_attn.q_proj", d, d)?,
                k: lin(w, "self_attn.k_proj", d, d)?,
                v: lin(w, "self_attn.v_proj", d, d)?,
                out: lin(w, "self_attn.out_proj", d, d)?,
                norm1: LayerNorm::load(w, &format!("{l}.layer_norm1"), d, cfg.eps)?,
                norm2: LayerNorm::load(w, &format!("{l}.layer_norm2"), d, cfg.eps)?,
                fc1: lin(w, "mlp.fc1", d, cfg.intermediate)?,
                fc2: lin(w, "mlp.fc2", cfg.intermediate, d)?,
            });
        }
        let post_layernorm = LayerNorm::load(w, &format!("{prefix}.post_layernorm"), d, 1e-5)?;
        Ok(Siglip { cfg, patch_weight, patch_bias, positions, layers, post_layernorm })
    }

    pub fn config(&self) -> &SiglipConfig {
        &self.cfg
    }

    /// `[B, H, W, C]` pixels → `[B, patches, hidden]` (after `post_layernorm`).
    pub fn forward(&self, pixels: &Array) -> Result<Array> {
        let p = self.cfg.patch;
        let x = mlx_rs::ops::conv2d(pixels, &self.patch_weight, (p, p), (0, 0), (1, 1), 1)?;
        let x = x.add(&self.patch_bias)?;
        let b = x.dim(0);
        let mut x = x.reshape(&[b, -1, self.cfg.hidden])?.add(&self.positions)?;
        let heads = self.cfg.heads;
        let head_dim = self.cfg.hidden / heads;
        let scale = (head_dim as f32).powf(-0.5);
        for layer in &self.layers {
            let h = layer.norm1.forward(&x)?;
            let split = |t: Array| -> Result<Array> {
                Ok(t.reshape(&[b, -1, heads, head_dim])?.transpose_axes(&[0, 2, 1, 3])?)
            };
            let (q, k, v) = (split(layer.q.forward(&h)?)?, split(layer.k.forward(&h)?)?, split(layer.v.forward(&h)?)?);
            let o = mlx_rs::fast::scaled_dot_product_attention(&q, &k, &v, scale, None, None)?;
            let o = o.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, -1, self.cfg.hidden])?;
            x = x.add(&layer.out.forward(&o)?)?;
            let h = layer.fc2.forward(&gelu_approx(&layer.fc1.forward(&layer.norm2.forward(&x)?)?)?)?;
            x = x.add(&h)?;
        }
        self.post_layernorm.forward(&x)
    }
}
