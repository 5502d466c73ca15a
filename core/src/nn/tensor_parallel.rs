//! Tensor parallelism with mlx-lm's sharding scheme (`Model.shard()` over mlx's `shard_linear`),
//! applied while a model loads: each rank keeps its slice of every projection and the partial
//! results meet in one `all_sum` per block half.
//!
//! For the Llama family (llama/mistral, qwen2, qwen3, ministral3) and Qwen3-MoE every layer's `q/k/v_proj` and
//! `gate/up_proj` are *all-to-sharded* (rank `r` keeps output rows `r*n/N .. (r+1)*n/N` of the
//! weight, its quantization scales/biases and its bias), and `o_proj` and `down_proj` are
//! *sharded-to-all* (rank `r` keeps the same slice of input columns; `x @ w^T` is summed over
//! the group, then the unsharded bias is added). Heads and KV heads divide by `N` (rank `r`
//! attends with query heads `r*H/N ..` and their own KV heads, as GQA groups stay whole),
//! the MLP's intermediate size too; embeddings, norms and the head are replicated. Qwen3-MoE's
//! stacked experts split the same way along their projection axes (every rank keeps every
//! expert's slice), the router stays replicated, and the sparse block all-sums its weighted
//! output (mlx-lm's `Qwen3MoeSparseMoeBlock` with a `sharding_group`).

use mlx_rs::Array;

use super::{DenseDecoderSpec, Linear, Weights};
use crate::distributed::Group;
use crate::{Error, Result};

/// The `model_type`s whose mlx-lm `shard()` is the scheme above.
pub const SHARDED_TYPES: [&str; 5] = ["llama", "qwen2", "qwen3", "ministral3", "qwen3_moe"];

/// Those of them over [`super::DenseDecoder`].
const DENSE_SHARDED_TYPES: [&str; 4] = ["llama", "qwen2", "qwen3", "ministral3"];

/// Slices `w` to this rank's part and divides `spec`'s heads and intermediate size.
pub(crate) fn shard_dense(w: &mut Weights, spec: &mut DenseDecoderSpec, group: &Group) -> Result<()> {
    let model_type = spec.info.model_type.as_str();
    if !DENSE_SHARDED_TYPES.contains(&model_type) || spec.fused_projections || !spec.nope_layers.is_empty() {
        return Err(Error::Unsupported(format!(
            "tensor parallel for {model_type:?} (supported: {})",
            SHARDED_TYPES.join(", ")
        )));
    }
    let n = group.size() as i32;
    let a = &mut spec.attention;
    a.heads = divide("num_attention_heads", a.heads, n)?;
    a.kv_heads = divide("num_key_value_heads", a.kv_heads, n)?;
    spec.intermediate = divide("intermediate_size", spec.intermediate, n)?;
    // Each rank holds (and its caches store) its own KV heads.
    spec.info.kv_heads /= n;
    for i in 0..spec.info.num_layers {
        let p = format!("model.layers.{i}");
        shard_attention(w, &format!("{p}.self_attn"), group)?;
        shard_mlp(w, &format!("{p}.mlp"), group)?;
    }
    Ok(())
}

/// `v / n`, or an `Unsupported` error naming `what` when `n` ranks cannot split it.
pub(crate) fn divide(what: &str, v: i32, n: i32) -> Result<i32> {
    if v % n != 0 {
        return Err(Error::Unsupported(format!("tensor parallel over {n} ranks: {what} = {v} does not divide")));
    }
    Ok(v / n)
}

/// mlx-lm's attention sharding: `q/k/v_proj` all-to-sharded, `o_proj` sharded-to-all (its
/// output is summed by [`sum_output_over`] once loaded).
pub(crate) fn shard_attention(w: &mut Weights, prefix: &str, group: &Group) -> Result<()> {
    for proj in ["q_proj", "k_proj", "v_proj"] {
        shard_rows(w, &format!("{prefix}.{proj}"), group)?;
    }
    shard_columns(w, &format!("{prefix}.o_proj"), group)
}

/// mlx-lm's SwiGLU sharding: `gate/up_proj` all-to-sharded, `down_proj` sharded-to-all. The
/// same holds for a stacked-experts `SwitchGLU` (mlx `shard_inplace`), whose block sums its
/// weighted output instead of the projection.
pub(crate) fn shard_mlp(w: &mut Weights, prefix: &str, group: &Group) -> Result<()> {
    shard_rows(w, &format!("{prefix}.gate_proj"), group)?;
    shard_rows(w, &format!("{prefix}.up_proj"), group)?;
    shard_columns(w, &format!("{prefix}.down_proj"), group)
}

/// mlx's `all-to-sharded` on the projection at `prefix`: rank `r` keeps its part of the output
/// rows (axis `ndim - 2` of the weight and of quantized scales/biases, so a stacked
/// `[experts, out, in]` keeps every expert) and of the bias.
fn shard_rows(w: &mut Weights, prefix: &str, group: &Group) -> Result<()> {
    for part in ["weight", "scales", "biases"] {
        slice(w, &format!("{prefix}.{part}"), Axis::Rows, group)?;
    }
    slice(w, &format!("{prefix}.bias"), Axis::Last, group)
}

/// mlx's `sharded-to-all` on the projection at `prefix`: rank `r` keeps its part of the input
/// columns (the last axis; packed quantized columns, scales, biases alike); the bias stays whole.
fn shard_columns(w: &mut Weights, prefix: &str, group: &Group) -> Result<()> {
    for part in ["weight", "scales", "biases"] {
        slice(w, &format!("{prefix}.{part}"), Axis::Last, group)?;
    }
    Ok(())
}

/// The axis mlx's `_shard` splits: `max(ndim - 2, 0)` for all-to-sharded weights, `-1` else.
#[derive(Clone, Copy)]
enum Axis {
    Rows,
    Last,
}

/// Replaces tensor `name` (when present) by this rank's part of `group.size()` equal parts
/// along `axis`, made contiguous as mlx's `_shard` does.
fn slice(w: &mut Weights, name: &str, axis: Axis, group: &Group) -> Result<()> {
    let Some(t) = w.remove(name) else { return Ok(()) };
    let (n, r) = (group.size() as i32, group.rank());
    let axis = match axis {
        Axis::Rows => (t.ndim() as i32 - 2).max(0),
        Axis::Last => -1,
    };
    let len = t.dim(axis);
    if len % n != 0 {
        return Err(Error::Unsupported(format!(
            "tensor parallel over {n} ranks: {name:?} has {len} along axis {axis}, which does not divide"
        )));
    }
    let part = t.split_equal(n, axis)?.swap_remove(r).contiguous()?;
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
