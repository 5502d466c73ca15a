//! Tensor parallelism with mlx-lm's sharding scheme (`Model.shard()` over mlx's `shard_linear`),
//! applied while a model loads: each rank keeps its slice of every projection and the partial
//! results meet in one `all_sum` per block half.
//!
//! For the Llama family (llama/mistral, qwen2, qwen3) every layer's `q/k/v_proj` and
//! `gate/up_proj` are *all-to-sharded* (rank `r` keeps output rows `r*n/N .. (r+1)*n/N` of the
//! weight, its quantization scales/biases and its bias), and `o_proj` and `down_proj` are
//! *sharded-to-all* (rank `r` keeps the same slice of input columns; `x @ w^T` is summed over
//! the group, then the unsharded bias is added). Heads and KV heads divide by `N` (rank `r`
//! attends with query heads `r*H/N ..` and their own KV heads, as GQA groups stay whole),
//! the MLP's intermediate size too; embeddings, norms and the head are replicated.

use std::cell::RefCell;

use mlx_rs::Array;

use super::{DenseDecoderSpec, Linear, Weights};
use crate::distributed::Group;
use crate::{Error, Result};

thread_local! {
    /// The group models loaded now on this thread shard over, and whether a loader took it.
    static PLAN: crate::distributed::LoadPlan = const { RefCell::new(None) };
}

/// Runs `load` (a model load, e.g. `loading::load`) with every layer sharded over `group`
/// (this rank's slices only). Errors if the model's architecture has no tensor-parallel
/// sharding, rather than silently loading it whole.
pub fn with_tensor_parallel<R>(group: &Group, load: impl FnOnce() -> Result<R>) -> Result<R> {
    crate::distributed::load_with_plan(&PLAN, group, load, || {
        format!("tensor parallel: this architecture has no sharding (supported: {})", SHARDED_TYPES.join(", "))
    })
}

/// The group the model being loaded on this thread shards over, if any; marks it taken.
pub(crate) fn take_group() -> Option<Group> {
    crate::distributed::take_plan(&PLAN)
}

/// The `model_type`s whose mlx-lm `shard()` is the scheme above, over [`super::DenseDecoder`].
pub const SHARDED_TYPES: [&str; 3] = ["llama", "qwen2", "qwen3"];

const ALL_TO_SHARDED: [&str; 5] = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"];
const SHARDED_TO_ALL: [&str; 2] = ["self_attn.o_proj", "mlp.down_proj"];

/// Slices `w` to this rank's part and divides `spec`'s heads and intermediate size.
pub(crate) fn shard_dense(w: &mut Weights, spec: &mut DenseDecoderSpec, group: &Group) -> Result<()> {
    let model_type = spec.info.model_type.as_str();
    if !SHARDED_TYPES.contains(&model_type) || spec.fused_projections || !spec.nope_layers.is_empty() {
        return Err(Error::Unsupported(format!(
            "tensor parallel for {model_type:?} (supported: {})",
            SHARDED_TYPES.join(", ")
        )));
    }
    let n = group.size() as i32;
    let a = &mut spec.attention;
    for (what, v) in [("num_attention_heads", a.heads), ("num_key_value_heads", a.kv_heads), ("intermediate_size", spec.intermediate)] {
        if v % n != 0 {
            return Err(Error::Unsupported(format!("tensor parallel over {n} ranks: {what} = {v} does not divide")));
        }
    }
    a.heads /= n;
    a.kv_heads /= n;
    spec.intermediate /= n;
    // Each rank holds (and its caches store) its own KV heads.
    spec.info.kv_heads /= n;
    let r = group.rank() as i32;
    for i in 0..spec.info.num_layers {
        for proj in ALL_TO_SHARDED {
            let p = format!("model.layers.{i}.{proj}");
            for part in ["weight", "scales", "biases"] {
                slice(w, &format!("{p}.{part}"), 0, n, r)?;
            }
            slice(w, &format!("{p}.bias"), -1, n, r)?;
        }
        for proj in SHARDED_TO_ALL {
            let p = format!("model.layers.{i}.{proj}");
            for part in ["weight", "scales", "biases"] {
                slice(w, &format!("{p}.{part}"), -1, n, r)?;
            }
        }
    }
    Ok(())
}

/// Replaces tensor `name` (when present) by part `r` of `n` equal parts along `axis`, made
/// contiguous as mlx's `_shard` does.
fn slice(w: &mut Weights, name: &str, axis: i32, n: i32, r: i32) -> Result<()> {
    let Some(t) = w.remove(name) else { return Ok(()) };
    let len = t.dim(axis);
    if len % n != 0 {
        return Err(Error::Unsupported(format!(
            "tensor parallel over {n} ranks: {name:?} has {len} along axis {axis}, which does not divide"
        )));
    }
    let part = t.split_equal(n, axis)?.swap_remove(r as usize).contiguous()?;
    // Materialize now so no forward pass redoes the slice (and the whole tensor can go).
    part.eval()?;
    w.insert(name.to_string(), part);
    Ok(())
}

/// Turns a loaded (column-sliced) projection into mlx's `ShardedToAllLinear`: the bias moves
/// after the sum, so it is added once.
pub(crate) fn sum_output_over(linear: &mut Linear, group: &Group) {
    let placeholder = Linear::Dense { weight: Array::from_f32(0.0), bias: None };
    let whole = std::mem::replace(linear, placeholder);
    *linear = match whole {
        Linear::Dense { weight, bias } => Linear::ShardedToAll {
            part: Box::new(Linear::Dense { weight, bias: None }),
            bias,
            group: group.clone(),
        },
        Linear::Quantized { weight, scales, biases, bias, spec, path } => Linear::ShardedToAll {
            part: Box::new(Linear::Quantized { weight, scales, biases, bias: None, spec, path }),
            bias,
            group: group.clone(),
        },
        already @ Linear::ShardedToAll { .. } => already,
    };
}

/// `all_sum(part(x)) (+ bias)`, as mlx's `ShardedToAllLinear.__call__` (and its quantized twin).
pub(crate) fn sharded_to_all(part: &Linear, bias: Option<&Array>, group: &Group, x: &Array) -> Result<Array> {
    let y = group.all_sum(&part.forward(x)?)?;
    Ok(match bias {
        Some(b) => y.add(b)?,
        None => y,
    })
}
