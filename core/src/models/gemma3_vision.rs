//! Gemma 3's vision half, as mlx-vlm `models/gemma3` has it: the SigLIP tower
//! (`vision_tower.vision_model.*`), then the multimodal projector
//! (`multi_modal_projector.*`): average-pool the patch grid down to
//! `sqrt(mm_tokens_per_image)` per side, Gemma RMSNorm (`mm_soft_emb_norm`, the vision
//! `layer_norm_eps`), project with `mm_input_projection_weight` `[vision, text]`. The soft
//! tokens are divided by `sqrt(hidden_size)` of the TOP-LEVEL config (mlx-vlm's
//! `ModelConfig.hidden_size`, default 2048) so the text model's embedding scale brings them
//! back. Kept in the checkpoint's dtype (mlx-vlm runs the tower in the embeddings' dtype).
//! Pixel values come from Gemma3ImageProcessor: bilinear resize to `image_size` square,
//! rescale 1/255, normalise with the processor's mean / std (0.5 for the released models).
//! Pan-and-scan (the original view plus crops of a wide or tall image) is on when the
//! checkpoint's processor config says `do_pan_and_scan: true`, as with the reference.

use mlx_rs::{Array, Dtype};

use super::ConfigReader;
use crate::nn::{RmsNorm, Weights};
use crate::nn::siglip::{Siglip, SiglipConfig};
use crate::vision::{ImageMarker, ImageProcessor, ImageSpec, Resample, Sizing, VisionTower};
use crate::{Error, Result};

pub struct Gemma3Vision {
    tower: Siglip,
    norm: RmsNorm,
    projection: Array,
    spec: ImageSpec,
    tokens_per_side: i32,
    /// `1 / sqrt(config hidden_size)`, applied in the tower's dtype.
    soft_scale: f64,
    dtype: Dtype,
}

fn req_i32(v: &ConfigReader, key: &str) -> Result<i32> {
    v.opt_i32(key)?.ok_or_else(|| Error::ModelLoad(format!("config.json: vision_config needs {key:?}")))
}

/// Whether the checkpoint carries a vision tower (the gemma3-as-text form has none, or a stray
/// tensor the text loader drops).
pub fn present(cfg: &ConfigReader, w: &Weights) -> bool {
    let has_sizes = cfg
        .get("vision_config")
        .and_then(|v| v.as_object())
        .is_some_and(|v| v.contains_key("hidden_size") && v.contains_key("patch_size"));
    has_sizes && w.contains("vision_tower.vision_model.embeddings.patch_embedding.weight")
}

/// Loads the tower and projector; `text_hidden` is the text model's width, `mm_tokens` its
/// `mm_tokens_per_image`.
pub fn load(cfg: &ConfigReader, w: &mut Weights, text_hidden: i32, mm_tokens: i32, dtype: Dtype) -> Result<Gemma3Vision> {
    let vcfg = cfg.get("vision_config").cloned().unwrap_or_default();
    let v = ConfigReader::new(&vcfg);
    if let Some(t) = v.get("model_type").and_then(|t| t.as_str()) {
        if !["siglip_vision_model", "gemma3", "gemma3_vision"].contains(&t) {
            return Err(Error::Unsupported(format!("gemma3: vision model_type {t:?}")));
        }
    }
    let sc = SiglipConfig {
        hidden: req_i32(&v, "hidden_size")?,
        layers: req_i32(&v, "num_hidden_layers")? as usize,
        heads: req_i32(&v, "num_attention_heads")?,
        intermediate: req_i32(&v, "intermediate_size")?,
        patch: req_i32(&v, "patch_size")?,
        image_size: v.opt_i32("image_size")?.unwrap_or(224),
        channels: v.opt_i32("num_channels")?.unwrap_or(3),
        eps: v.f32_or("layer_norm_eps", 1e-6)?,
    };
    if sc.channels != 3 || sc.hidden % sc.heads != 0 || sc.image_size % sc.patch != 0 {
        return Err(Error::ModelLoad(format!("gemma3: inconsistent vision_config {vcfg}")));
    }
    let per_side = sc.patches_per_side();
    let tokens_per_side = (mm_tokens as f64).sqrt() as i32;
    if tokens_per_side * tokens_per_side != mm_tokens || tokens_per_side == 0 || per_side % tokens_per_side != 0 {
        return Err(Error::ModelLoad(format!(
            "gemma3: mm_tokens_per_image {mm_tokens} must be a square whose side divides {per_side} patches"
        )));
    }
    let vision_hidden = sc.hidden;
    let eps = sc.eps;
    let size = sc.image_size as usize;
    let tower = Siglip::load(w, "vision_tower.vision_model", sc)?;
    let norm = RmsNorm::load_gemma(w, "multi_modal_projector.mm_soft_emb_norm", vision_hidden, eps)?;
    let projection = w.take("multi_modal_projector.mm_input_projection_weight", &[vision_hidden, text_hidden])?;
    let top_hidden = cfg.opt_i32("hidden_size")?.unwrap_or(2048);
    let token = |key: &str, default: i64| -> Result<u32> {
        let v = cfg.get(key).and_then(|v| v.as_i64()).unwrap_or(default);
        u32::try_from(v).map_err(|_| Error::ModelLoad(format!("config.json: {key:?} must be a token id")))
    };
    let spec = ImageSpec {
        processor: processor(cfg, size)?,
        image_token_id: token("image_token_index", 262_144)?,
        tokens_per_image: mm_tokens as usize,
        begin_token_id: Some(token("boi_token_index", 255_999)?),
        end_token_id: Some(token("eoi_token_index", 256_000)?),
        zeroed_token_id: Some(token("pad_token_id", 0)?),
        max_images: 8,
        marker: ImageMarker::BeginOfImage,
        bidirectional: false,
    };
    Ok(Gemma3Vision {
        tower,
        norm,
        projection,
        spec,
        tokens_per_side,
        soft_scale: (top_hidden as f64).sqrt(),
        dtype,
    })
}

/// Gemma3ImageProcessor for a `size` square tower: the released models' settings, overridden
/// by the checkpoint's processor config (resample, rescale, mean / std, pan-and-scan) when the
/// loader found one.
fn processor(cfg: &ConfigReader, size: usize) -> Result<ImageProcessor> {
    let mut p = ImageProcessor {
        height: size,
        width: size,
        resample: Resample::Bilinear,
        rescale_factor: 1.0 / 255.0,
        mean: [0.5; 3],
        std: [0.5; 3],
        sizing: Sizing::Fixed,
        pan_and_scan: None,
    };
    let Some(pc) = cfg.get(crate::vision::PROCESSOR_CONFIG_KEY).and_then(crate::vision::image_processor_config) else {
        return Ok(p);
    };
    if let Some(code) = pc.get("resample").and_then(|v| v.as_i64()) {
        p.resample = Resample::from_pil(code)?;
    }
    if let Some(f) = pc.get("rescale_factor").and_then(|v| v.as_f64()) {
        p.rescale_factor = f;
    }
    let triple = |k: &str| -> Result<Option<[f32; 3]>> {
        match pc.get(k) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(v) => {
                let xs: Vec<f32> = v.as_array().into_iter().flatten().filter_map(|x| x.as_f64()).map(|x| x as f32).collect();
                <[f32; 3]>::try_from(xs)
                    .map(Some)
                    .map_err(|_| Error::ModelLoad(format!("image processor config: {k} must be 3 numbers")))
            }
        }
    };
    if let Some(m) = triple("image_mean")? {
        p.mean = m;
    }
    if let Some(s) = triple("image_std")? {
        p.std = s;
    }
    p.pan_and_scan = crate::vision::PanAndScan::from_config(pc)?;
    Ok(p)
}

impl Gemma3Vision {
    /// The projector (mlx-vlm `Gemma3MultiModalProjector`), op for op.
    fn project(&self, x: &Array) -> Result<Array> {
        let (b, l) = (x.dim(0), x.dim(2));
        let p = self.tower.config().patches_per_side();
        let t = self.tokens_per_side;
        let k = p / t;
        let x = x.transpose_axes(&[0, 2, 1])?.reshape(&[b, l, p, p])?.transpose_axes(&[0, 2, 3, 1])?;
        // nn.AvgPool2d with stride == kernel: non-overlapping windows, mean over them.
        let x = x.reshape(&[b, t, k, t, k, l])?.transpose_axes(&[0, 1, 3, 2, 4, 5])?;
        let x = x.mean_axes(&[-3, -2], false)?;
        let x = x.transpose_axes(&[0, 3, 1, 2])?.reshape(&[b, l, t * t])?.transpose_axes(&[0, 2, 1])?;
        let x = self.norm.forward(&x)?;
        Ok(x.matmul(&self.projection)?.as_dtype(self.dtype)?)
    }

    /// Tower + projector output (mlx-vlm's `image_features`), before the splice scaling.
    pub fn image_features(&self, pixels: &Array) -> Result<Array> {
        self.project(&self.tower.forward(&pixels.as_dtype(self.dtype)?)?)
    }
}

impl VisionTower for Gemma3Vision {
    fn spec(&self) -> &ImageSpec {
        &self.spec
    }

    fn encode(&self, pixels: &Array) -> Result<Array> {
        let f = self.image_features(pixels)?;
        // mlx-vlm: image_features / hidden_size**0.5 (a Python float: stays in f's dtype).
        let s = Array::from_f32(self.soft_scale as f32).as_dtype(f.dtype())?;
        Ok(f.divide(&s)?)
    }
}
