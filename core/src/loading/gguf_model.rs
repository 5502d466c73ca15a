//! GGUF checkpoints: architecture config from the metadata, tensors read here ([`read_tensors`],
//! the file opened and mapped read-only, so read-only files and mounts load; Q4_0 / Q4_1 / Q8_0
//! arrive as MLX affine-quantized triples, as MLX's own reader gives them), renamed to the
//! Hugging Face layout our architectures load, with llama.cpp's q/k row permutation undone.
//!
//! Files with other block types ([`repacked_arrays`]): in [`GgufWeights::Native`]
//! mode the types with a lossless affine form stay quantized (`super::gguf_affine`: Q5_0/Q5_1 →
//! 5-bit, Q4_K → 4-bit, Q5_K → 5-bit, all group 32), Q6_K is rounded to 8-bit group 32 with the
//! fast CPU kernels (float32 otherwise), the rest are expanded to float32; in
//! [`GgufWeights::Dequantize`] mode everything is expanded (the goldens' weights).
//!
//! Conversion decisions (the goldens script does the same in Python):
//! - Q4_0 / Q4_1 → 4-bit, group 32; Q8_0 → 8-bit, group 32 (one quantization override per module).
//! - Scales, biases and unquantized float tensors are cast to float32: on CPU, fp16 quantized
//!   matmuls are ~50x slower than fp32.
//! - `output.weight` absent → tied embeddings.
//! - Before MLX reads any tensor data, the tensor table is checked by GGUF names: supported types,
//!   data inside the file (truncated downloads), every name mapped, every required tensor present.

use std::collections::HashMap;
use std::path::Path;

use mlx_rs::{Array, Dtype};
use serde_json::json;

use super::gguf_affine::{affine_bits, repack, requantize_q6_k};
use super::gguf_dequant::{block_geometry, dequantize};
use super::{build_model, push_unique, GenerationDefaults, GgufWeights, LoadedModel};
use crate::gguf::{GgmlType, GgufHeader, SUPPORTED_TENSOR_TYPES};
use crate::nn::LayerOptions;
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

pub fn load(path: &Path, weights: GgufWeights, layers: &LayerOptions) -> Result<LoadedModel> {
    let header = GgufHeader::read(path)?;
    header.check_supported_tensor_types()?;
    let arch = header
        .get_str("general.architecture")
        .ok_or_else(|| Error::ModelLoad("GGUF has no general.architecture".into()))?
        .to_string();
    let mut config = config_from_metadata(&header, &arch)?;
    check_tensor_extents(&header, path)?;
    check_tensor_names(&header, &arch, config["num_hidden_layers"].as_u64().unwrap_or(0))?;

    let mut raw = read_tensors(&header, path, weights, layers)?;
    take_rope_factors(&mut raw, &mut config)?;

    let heads = config["num_attention_heads"].as_i64().unwrap_or(0) as i32;
    let kv_heads = config["num_key_value_heads"].as_i64().unwrap_or(0) as i32;
    // llama.cpp interleaves q/k rows for its RoPE only in llama-style conversions.
    let permuted_qk = matches!(arch.as_str(), "llama" | "mistral" | "granite" | "minicpm");
    // llama.cpp stores Gemma's RMSNorm weights as 1 + w (its norm multiplies by the weight).
    let norm_shift = arch.starts_with("gemma");

    // The fast CPU kernels read float16 scales and biases as GGUF stores them (lossless), which
    // saves a fifth of a 4-bit layer's bytes per step. MLX's own kernel is slow with them and
    // the embedding's scales set the activation dtype, so those are cast to float32.
    let half_scales = layers.keeps_half_scales();
    let mut quantization = serde_json::Map::new();
    let mut tensors = HashMap::with_capacity(raw.len());
    for (name, array) in raw {
        let (base, suffix) = split_suffix(&name);
        let module = hf_module_name(base, &arch).ok_or_else(|| {
            Error::Unsupported(format!("GGUF tensor {name:?} has no known mapping for {arch}"))
        })?;
        let keep = array.dtype() == Dtype::Uint32 || (half_scales && is_scale(suffix) && module != "model.embed_tokens");
        let mut array = if keep { array } else { array.as_dtype(Dtype::Float32)? };
        if norm_shift && module.ends_with("norm") && suffix == "weight" {
            array = array.subtract(Array::from_f32(1.0))?;
        }
        if permuted_qk {
            if module.ends_with("self_attn.q_proj") {
                array = unpermute_rows(&array, heads)?;
            } else if module.ends_with("self_attn.k_proj") {
                array = unpermute_rows(&array, kv_heads)?;
            }
        }
        if suffix == "scales" {
            quantization.insert(module.clone(), json!({ "group_size": 32, "bits": 0 }));
        }
        tensors.insert(format!("{module}.{suffix}"), array);
    }
    // Bits follow from the packed width: u32 words per row × 32 / the row's elements.
    for (module, q) in quantization.iter_mut() {
        let (Some(w), Some(s)) = (tensors.get(&format!("{module}.weight")), tensors.get(&format!("{module}.scales"))) else {
            return Err(Error::ModelLoad(format!("GGUF: {module} has scales without a weight")));
        };
        let cols = s.shape()[s.ndim() - 1] * 32;
        q["bits"] = json!(w.shape()[w.ndim() - 1] * 32 / cols.max(1));
    }
    if !quantization.is_empty() {
        config["quantization"] = serde_json::Value::Object(quantization);
    }
    // llama.cpp's minicpm scales the head input whether or not the head is tied, which is
    // mlx-lm's untied MiniCPM with the embedding as head.
    if !tensors.contains_key("lm_head.weight") && arch != "minicpm" {
        config["tie_word_embeddings"] = json!(true);
    }
    let model = build_model(&config, tensors, layers)?;

    // A GGUF without tokenizer metadata (e.g. a bare test checkpoint) still runs on token ids.
    let tokenizer = match header.get_str("tokenizer.ggml.model") {
        Some(_) => Some(Tokenizer::from_gguf(&header)?),
        None => None,
    };
    let mut eos = Vec::new();
    if let Some(t) = &tokenizer {
        push_unique(&mut eos, t.eos_token_ids().iter().copied());
    } else if let Some(id) = header.get_u64("tokenizer.ggml.eos_token_id") {
        eos.push(id as u32);
    }
    Ok(LoadedModel {
        constraints: Default::default(),
        model,
        tokenizer,
        eos_token_ids: eos,
        defaults: GenerationDefaults::default(),
        source: path.to_path_buf(),
        numerics: String::new(),
        options: Default::default(),
    })
}

/// [`read_tensors`] of a file whose header and tensor extents check out.
pub(super) fn tensors(path: &Path, weights: GgufWeights) -> Result<Vec<(String, Array)>> {
    let header = GgufHeader::read(path)?;
    header.check_supported_tensor_types()?;
    check_tensor_extents(&header, path)?;
    // As the exact kernels take them (float32 scales, no fast-mode rounding).
    let layers = LayerOptions::new(crate::kernels::CpuKernels::Exact, None, None, None)?;
    read_tensors(&header, path, weights, &layers)
}

/// A config.json equivalent for the architectures we implement, from `<arch>.*` metadata.
fn config_from_metadata(h: &GgufHeader, arch: &str) -> Result<serde_json::Value> {
    let model_type = match arch {
        "llama" | "mistral" => "llama",
        "qwen2" => "qwen2",
        "qwen3" => "qwen3",
        "gemma2" => "gemma2",
        "gemma3" => "gemma3_text",
        "granite" => "granite",
        "minicpm" => "minicpm",
        "phi3" => "phi3",
        other => {
            return Err(Error::Unsupported(format!(
                "GGUF architecture {other:?} (supported: llama, mistral, qwen2, qwen3, gemma2, gemma3, granite, minicpm, phi3)"
            )))
        }
    };
    let int = |k: &str| -> Result<u64> {
        h.get_u64(&format!("{arch}.{k}"))
            .ok_or_else(|| Error::ModelLoad(format!("GGUF metadata is missing {arch}.{k}")))
    };
    let hidden = int("embedding_length")?;
    let heads = int("attention.head_count")?;
    let kv_heads = h.get_u64(&format!("{arch}.attention.head_count_kv")).unwrap_or(heads);
    let head_dim = h.get_u64(&format!("{arch}.attention.key_length")).unwrap_or(hidden / heads.max(1));
    let vocab = match h.get_u64(&format!("{arch}.vocab_size")) {
        Some(v) => v,
        None => h
            .get_str_array("tokenizer.ggml.tokens")
            .map(|t| t.len() as u64)
            .ok_or_else(|| Error::ModelLoad("GGUF has neither vocab_size nor tokenizer.ggml.tokens".into()))?,
    };
    let mut cfg = json!({
        "model_type": model_type,
        "hidden_size": hidden,
        "num_hidden_layers": int("block_count")?,
        "intermediate_size": int("feed_forward_length")?,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": vocab,
        "rms_norm_eps": h.get_f64(&format!("{arch}.attention.layer_norm_rms_epsilon")).unwrap_or(1e-5),
        "rope_theta": h.get_f64(&format!("{arch}.rope.freq_base")).unwrap_or(10000.0),
        "tie_word_embeddings": false,
    });
    if let Some(ctx) = h.get_u64(&format!("{arch}.context_length")) {
        cfg["max_position_embeddings"] = json!(ctx);
    }
    let float = |k: &str| -> Result<f64> {
        h.get_f64(&format!("{arch}.{k}"))
            .ok_or_else(|| Error::ModelLoad(format!("GGUF metadata is missing {arch}.{k}")))
    };
    if arch == "granite" {
        // llama.cpp's granite keys for Granite's four multipliers.
        cfg["attention_multiplier"] = json!(float("attention.scale")?);
        cfg["embedding_multiplier"] = json!(float("embedding_scale")?);
        cfg["residual_multiplier"] = json!(float("residual_scale")?);
        cfg["logits_scaling"] = json!(float("logit_scale")?);
        cfg["attention_bias"] = json!(false);
        cfg["mlp_bias"] = json!(false);
    }
    if arch == "minicpm" {
        // llama.cpp stores the derived scales: residual = scale_depth / sqrt(layers),
        // logit = hidden / dim_model_base.
        let layers = int("block_count")? as f64;
        cfg["scale_emb"] = json!(float("embedding_scale")?);
        cfg["scale_depth"] = json!(float("residual_scale")? * layers.sqrt());
        let logit = float("logit_scale")?;
        let base = hidden as f64 / logit;
        if base.fract() != 0.0 || base < 1.0 {
            return Err(Error::ModelLoad(format!("GGUF minicpm.logit_scale {logit} does not divide the hidden size {hidden}")));
        }
        cfg["dim_model_base"] = json!(base as u64);
    }
    if arch == "gemma2" {
        // llama.cpp's gemma2: both soft caps in the metadata; queries scaled by
        // head_dim^-0.5, except the 27B (46 blocks), which uses (hidden / heads)^-0.5.
        cfg["attn_logit_softcapping"] = json!(float("attn_logit_softcapping")?);
        cfg["final_logit_softcapping"] = json!(float("final_logit_softcapping")?);
        let qpas = if int("block_count")? == 46 { hidden / heads.max(1) } else { head_dim };
        cfg["query_pre_attn_scalar"] = json!(qpas);
        if let Some(w) = h.get_u64(&format!("{arch}.attention.sliding_window")) {
            cfg["sliding_window"] = json!(w);
        }
    }
    if arch == "phi3" {
        // llama.cpp's phi3: the rotated dims (partial rotary) and longrope's original context;
        // the factors themselves are tensors (see `take_rope_factors`).
        if let Some(dims) = h.get_u64(&format!("{arch}.rope.dimension_count")) {
            cfg["partial_rotary_factor"] = json!(dims as f64 / head_dim as f64);
        }
        if let Some(orig) = h.get_u64(&format!("{arch}.rope.scaling.original_context_length")) {
            cfg["original_max_position_embeddings"] = json!(orig);
        }
    }
    if arch == "gemma3" {
        // What the GGUF does not say, llama.cpp fixes for Gemma 3 as the Hugging Face configs do:
        // every 6th layer global, local RoPE base 10000, queries scaled by 1/sqrt(head_dim).
        cfg["sliding_window"] = json!(int("attention.sliding_window")?);
        cfg["sliding_window_pattern"] = json!(6);
        cfg["rope_local_base_freq"] = json!(10000.0);
        cfg["query_pre_attn_scalar"] = json!(head_dim);
        cfg["rope_theta"] = json!(h.get_f64(&format!("{arch}.rope.freq_base")).unwrap_or(1_000_000.0));
        match h.get_str(&format!("{arch}.rope.scaling.type")) {
            None | Some("none") => {}
            Some("linear") => {
                let factor = h
                    .get_f64(&format!("{arch}.rope.scaling.factor"))
                    .ok_or_else(|| Error::ModelLoad(format!("GGUF {arch}.rope.scaling.factor is missing")))?;
                cfg["rope_scaling"] = json!({"rope_type": "linear", "factor": factor});
            }
            Some(other) => {
                return Err(Error::Unsupported(format!("GGUF {arch}.rope.scaling.type {other:?} (supported: linear)")))
            }
        }
    }
    Ok(cfg)
}

/// llama.cpp writes Phi-3's longrope factors as the tensors `rope_factors_long.weight` and
/// `rope_factors_short.weight`; they become `rope_scaling` (longrope) in the config.
fn take_rope_factors(raw: &mut Vec<(String, Array)>, config: &mut serde_json::Value) -> Result<()> {
    let mut factor = |name: &str| -> Result<Option<Vec<f32>>> {
        let Some(i) = raw.iter().position(|(n, _)| n == name) else { return Ok(None) };
        let a = raw.remove(i).1.as_dtype(Dtype::Float32)?;
        a.eval()?;
        Ok(Some(a.as_slice::<f32>().to_vec()))
    };
    let (long, short) = (factor("rope_factors_long.weight")?, factor("rope_factors_short.weight")?);
    match (long, short) {
        (None, None) => Ok(()),
        (Some(long), Some(short)) => {
            config["rope_scaling"] = json!({"type": "longrope", "long_factor": long, "short_factor": short});
            Ok(())
        }
        _ => Err(Error::ModelLoad("GGUF has one of rope_factors_long / rope_factors_short but not the other".into())),
    }
}

/// Rope factor tensors are model options, not modules (see `take_rope_factors`).
fn is_rope_factors(base: &str) -> bool {
    matches!(base, "rope_factors_long" | "rope_factors_short")
}

/// Every tensor's data must lie inside the file (a truncated download otherwise reads past the
/// end), and quantized rows must be whole 32-element blocks.
fn check_tensor_extents(h: &GgufHeader, path: &Path) -> Result<()> {
    let file_len = std::fs::metadata(path).map_err(|e| Error::io(path, e))?.len();
    for t in &h.tensors {
        let (block, block_bytes) = block_geometry(t.ggml_type())
            .map(|(e, b)| (e as u64, b as u64))
            .ok_or_else(|| Error::Unsupported(format!("GGUF tensor '{}' has type {}", t.name, t.type_name())))?;
        let row = t.dims.first().copied().unwrap_or(1);
        if row % block != 0 {
            return Err(Error::ModelLoad(format!(
                "GGUF tensor '{}' ({}) has rows of {row} elements, not whole {block}-element blocks",
                t.name,
                t.type_name()
            )));
        }
        let end = t
            .dims
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .and_then(|n| (n / block).checked_mul(block_bytes))
            .and_then(|bytes| h.data_offset.checked_add(t.offset)?.checked_add(bytes));
        match end {
            Some(end) if end <= file_len => {}
            _ => {
                return Err(Error::ModelLoad(format!(
                    "{}: GGUF tensor '{}' extends past the end of the file ({file_len} bytes); \
                     the file is truncated or corrupt",
                    path.display(),
                    t.name
                )))
            }
        }
    }
    Ok(())
}

/// Checks the tensor table by GGUF names (MLX splits quantized tensors into weight / scales /
/// biases, and model building knows only Hugging Face names): every tensor maps to a module of a
/// block below `layers`, and every tensor `arch` requires is there. `output.weight` is optional
/// (tied embeddings).
fn check_tensor_names(h: &GgufHeader, arch: &str, layers: u64) -> Result<()> {
    for t in &h.tensors {
        let (base, _) = split_suffix(&t.name);
        if hf_module_name(base, arch).is_none() && !(arch == "phi3" && is_rope_factors(base)) {
            return Err(Error::Unsupported(format!("GGUF tensor '{}' has no known mapping for {arch}", t.name)));
        }
        let block = base.strip_prefix("blk.").and_then(|r| r.split('.').next()?.parse::<u64>().ok());
        if block.is_some_and(|b| b >= layers) {
            return Err(Error::ModelLoad(format!(
                "GGUF tensor '{}' belongs to a block beyond {arch}.block_count = {layers}",
                t.name
            )));
        }
    }
    let mut per_block = vec![
        "attn_norm.weight",
        "attn_q.weight",
        "attn_k.weight",
        "attn_v.weight",
        "attn_output.weight",
        "ffn_norm.weight",
        "ffn_gate.weight",
        "ffn_up.weight",
        "ffn_down.weight",
    ];
    if arch == "phi3" {
        // Fused projections: attn_qkv instead of q/k/v, ffn_up holding gate and up.
        per_block.retain(|p| !matches!(*p, "attn_q.weight" | "attn_k.weight" | "attn_v.weight" | "ffn_gate.weight"));
        per_block.push("attn_qkv.weight");
    }
    match arch {
        "qwen2" => per_block.extend(["attn_q.bias", "attn_k.bias", "attn_v.bias"]),
        "qwen3" => per_block.extend(["attn_q_norm.weight", "attn_k_norm.weight"]),
        "gemma3" => per_block.extend([
            "attn_q_norm.weight",
            "attn_k_norm.weight",
            "post_attention_norm.weight",
            "post_ffw_norm.weight",
        ]),
        "gemma2" => per_block.extend(["post_attention_norm.weight", "post_ffw_norm.weight"]),
        _ => {}
    }
    let present: std::collections::HashSet<&str> = h.tensors.iter().map(|t| t.name.as_str()).collect();
    let required = ["token_embd.weight".to_string(), "output_norm.weight".to_string()]
        .into_iter()
        .chain((0..layers).flat_map(|i| per_block.iter().map(move |p| format!("blk.{i}.{p}"))));
    for name in required {
        if !present.contains(name.as_str()) {
            return Err(Error::ModelLoad(format!(
                "GGUF is missing tensor '{name}' (required for {arch} with {layers} blocks)"
            )));
        }
    }
    Ok(())
}

/// Every tensor of a GGUF file, read here (a read-only open and mapping: MLX's own GGUF reader
/// opens the file read-write, which fails on a read-only file, mount or app bundle), under the
/// names MLX's reader gives them. Files whose types MLX reads (F32, F16, Q4_0, Q4_1, Q8_0) come
/// out as that reader gives them, whatever `weights` says: Q4_0 / Q4_1 / Q8_0 matrices as MLX
/// quantized triples (`name`, `*.scales`, `*.biases`), the rest as floats. Other files follow
/// `weights` ([`repacked_arrays`]).
fn read_tensors(h: &GgufHeader, path: &Path, weights: GgufWeights, layers: &LayerOptions) -> Result<Vec<(String, Array)>> {
    let native = h.tensors.iter().all(|t| SUPPORTED_TENSOR_TYPES.contains(&t.ggml_type()));
    repacked_arrays(h, path, if native { GgufWeights::Native } else { weights }, layers)
}

/// The tensors of a file: matrices of a type with a lossless affine form as MLX quantized
/// triples (`name`, `*.scales`, `*.biases`, as MLX's own reader names them) in `Native` mode,
/// everything else expanded to float32 by [`dequantize`].
fn repacked_arrays(h: &GgufHeader, path: &Path, weights: GgufWeights, layers: &LayerOptions) -> Result<Vec<(String, Array)>> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    // SAFETY: read-only mapping of a model file we do not modify; extents were checked.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
    // Weft's fast CPU kernels take 4, 5 and 8 bits: Q6_K is rounded to 8 bits there (lossy, so
    // only in fast mode: exact mode keeps its float32 expansion).
    let fast = layers.fast_on_cpu();
    let half_scales = layers.keeps_half_scales();
    let mut out = Vec::with_capacity(h.tensors.len());
    for t in &h.tensors {
        let (block, block_bytes) = block_geometry(t.ggml_type())
            .ok_or_else(|| Error::Unsupported(format!("GGUF tensor '{}' has type {}", t.name, t.type_name())))?;
        let n: u64 = t.dims.iter().product();
        let start = (h.data_offset + t.offset) as usize;
        let bytes = &map[start..start + (n as usize / block) * block_bytes];
        let shape: Vec<i32> = t.dims.iter().rev().map(|&d| d as i32).collect();
        let matrix = weights == GgufWeights::Native && shape.len() == 2;
        let lossless = matrix && affine_bits(t.ggml_type()).is_some();
        let rounded = matrix && fast && t.ggml_type() == GgmlType::Q6_K;
        if lossless || rounded {
            let (rows, cols) = (shape[0], shape[1] as usize);
            let a = if lossless { repack(t.ggml_type(), bytes, cols) } else { requantize_q6_k(bytes, cols) }
                .map_err(|e| Error::ModelLoad(format!("GGUF tensor '{}': {e}", t.name)))?;
            let (base, _) = split_suffix(&t.name);
            let groups = (cols / super::gguf_affine::GROUP_SIZE) as i32;
            out.push((t.name.clone(), Array::from_slice(&a.packed, &[rows, (cols * a.bits as usize / 32) as i32])));
            let half = half_scales && base != "token_embd";
            let (scales, biases) = scale_arrays(&a.scales, &a.biases, &[rows, groups], half);
            out.push((format!("{base}.scales"), scales));
            out.push((format!("{base}.biases"), biases));
        } else {
            let values = dequantize(t.ggml_type(), bytes, n as usize)
                .map_err(|e| Error::ModelLoad(format!("GGUF tensor '{}': {e}", t.name)))?;
            out.push((t.name.clone(), Array::from_slice(&values, &shape)));
        }
    }
    Ok(out)
}

fn is_scale(suffix: &str) -> bool {
    matches!(suffix, "scales" | "biases")
}

/// Scales and biases as float16 when `half` and every value of both is one exactly (Q4_0 /
/// Q4_1 / Q5_0 / Q5_1 / Q8_0: the file's float16 values times a power of two; K-quant products
/// usually are not), else both float32 (the kernel takes them in one dtype).
fn scale_arrays(scales: &[f32], biases: &[f32], shape: &[i32], half: bool) -> (Array, Array) {
    let to_half = |values: &[f32]| -> Option<Vec<half::f16>> {
        values
            .iter()
            .map(|&v| {
                let h = half::f16::from_f32(v);
                (h.to_f32() == v || (v.is_nan() && h.is_nan())).then_some(h)
            })
            .collect()
    };
    if half {
        if let (Some(s), Some(b)) = (to_half(scales), to_half(biases)) {
            return (Array::from_slice(&s, shape), Array::from_slice(&b, shape));
        }
    }
    (Array::from_slice(scales, shape), Array::from_slice(biases, shape))
}

/// `blk.3.attn_q.weight` → (`blk.3.attn_q`, `weight`).
fn split_suffix(name: &str) -> (&str, &str) {
    match name.rsplit_once('.') {
        Some((base, suffix @ ("weight" | "bias" | "scales" | "biases"))) => (base, suffix),
        _ => (name, "weight"),
    }
}

/// GGUF module names → Hugging Face module names (Gemma's four norms per block differ; Phi-3
/// keeps its fused projections).
fn hf_module_name(base: &str, arch: &str) -> Option<String> {
    match base {
        "token_embd" => return Some("model.embed_tokens".into()),
        "output_norm" => return Some("model.norm".into()),
        "output" => return Some("lm_head".into()),
        _ => {}
    }
    let rest = base.strip_prefix("blk.")?;
    let (layer, part) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let gemma = matches!(arch, "gemma2" | "gemma3");
    let part = match part {
        "attn_qkv" if arch == "phi3" => "self_attn.qkv_proj",
        "ffn_up" if arch == "phi3" => "mlp.gate_up_proj",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        "attn_norm" => "input_layernorm",
        "ffn_norm" if gemma => "pre_feedforward_layernorm",
        "post_attention_norm" if gemma => "post_attention_layernorm",
        "post_ffw_norm" if gemma => "post_feedforward_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{part}"))
}

/// Inverse of llama.cpp's `permute`: per head, rows were reordered from [2, half] to
/// [half, 2]; reshape to `[n_head, half, 2, ...]`, swap axes 1 and 2, reshape back. Applies to
/// packed weights, scales and biases alike (all are row-major over output rows).
fn unpermute_rows(a: &Array, n_head: i32) -> Result<Array> {
    let shape = a.shape().to_vec();
    let rows = shape[0];
    if n_head <= 0 || rows % (2 * n_head) != 0 {
        return Err(Error::ModelLoad(format!(
            "cannot un-permute {rows} rows over {n_head} heads"
        )));
    }
    let mut split = vec![n_head, rows / n_head / 2, 2];
    split.extend_from_slice(&shape[1..]);
    Ok(a.reshape(&split)?.swap_axes(1, 2)?.reshape(&shape)?)
}
