#!/usr/bin/env python3
"""GGUF files of the tiny granite and minicpm models (goldens/models/granite, .../minicpm), laid
out as llama.cpp's convert_hf_to_gguf.py writes those architectures.

Usage (from the repo root):
    .venv/bin/python goldens/make_arch_gguf_goldens.py

Writes goldens/gguf/granite-f32.gguf and goldens/gguf/minicpm-f32.gguf: llama.cpp tensor names
and q/k row permutation (make_gguf_goldens.py's `gguf_name` / `permute`, as llama.cpp's Granite
and MiniCPM converters permute like Llama), every tensor F32, and the architecture's scalars
in llama.cpp's keys:
- granite: `granite.attention.scale` = attention_multiplier, `granite.embedding_scale`,
  `granite.residual_scale`, `granite.logit_scale` = logits_scaling;
- minicpm: `minicpm.embedding_scale` = scale_emb, `minicpm.residual_scale` =
  scale_depth / sqrt(num_hidden_layers), `minicpm.logit_scale` = hidden_size / dim_model_base.
- gemma2 (goldens/gguf/gemma2-f32.gguf, from goldens/models/gemma2-gguf): llama.cpp's Gemma
  norm names (`attn_norm`, `post_attention_norm`, `ffn_norm`, `post_ffw_norm`) holding 1 + w
  (exact: the model's norm weights sit on a 2^-16 grid), `gemma2.attention.key_length` /
  `value_length`, `gemma2.attn_logit_softcapping`, `gemma2.final_logit_softcapping`,
  `gemma2.attention.sliding_window`; no q/k permutation; query_pre_attn_scalar = head_dim,
  which llama.cpp assumes for every Gemma 2 but the 27B;
- phi3 (goldens/gguf/phi3-f32.gguf): llama.cpp's Phi-3 layout: fused `attn_qkv` and `ffn_up`
  (gate then up halves, no `ffn_gate`), no q/k permutation, `phi3.rope.dimension_count` =
  the rotated dims, `phi3.rope.scaling.original_context_length`, and longrope's factors as the
  F32 tensors `rope_factors_long.weight` / `rope_factors_short.weight` (plus
  `phi3.rope.scaling.attn_factor`, the mscale, which llama.cpp writes and Weft recomputes).
The weights are the safetensors model's exactly, so goldens/granite.json, goldens/minicpm.json
goldens/phi3.json and goldens/gemma2-gguf.json (mlx-lm on those weights) are the references. The script reads every tensor back with MLX's
GGUF reader and checks it against the source after un-permuting.
"""

import json
import math
import sys
from pathlib import Path

import numpy as np

import mlx.core as mx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import make_gguf_goldens as mgg  # noqa: E402  (names, permutation, source loading)

import gguf  # noqa: E402


# Phi-3's fused projections (llama.cpp keeps the fused layout under these names).
FUSED = {"self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"}


# Gemma's four norms per block under llama.cpp's names.
GEMMA_NORMS = {"input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
               "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm"}


def gguf_name(hf, arch=None):
    stem, suffix = hf.rsplit(".", 1)
    parts = stem.split(".", 3)
    if parts[:2] == ["model", "layers"] and parts[3] in FUSED:
        return f"blk.{int(parts[2])}.{FUSED[parts[3]]}.{suffix}"
    if arch == "gemma2" and parts[:2] == ["model", "layers"] and parts[3] in GEMMA_NORMS:
        return f"blk.{int(parts[2])}.{GEMMA_NORMS[parts[3]]}.{suffix}"
    return mgg.gguf_name(hf)


def write(src):
    weights, cfg = mgg.load_source(src)
    arch = cfg["model_type"]
    # llama.cpp stores Gemma's RMSNorm weights as 1 + w.
    shift = (lambda hf: 1.0 if hf.endswith("norm.weight") else 0.0) if arch == "gemma2" else (lambda hf: 0.0)
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    rope_dims = int(cfg.get("partial_rotary_factor", 1.0) * head_dim)
    path = mgg.OUT_DIR / f"{src.removesuffix('-gguf')}-f32.gguf"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_type("model")
    w.add_name(f"weft-tiny-{src}")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_rope_dimension_count(rope_dims)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_eos_token_id(cfg["eos_token_id"])
    if arch == "granite":
        w.add_attention_scale(cfg["attention_multiplier"])
        w.add_embedding_scale(cfg["embedding_multiplier"])
        w.add_residual_scale(cfg["residual_multiplier"])
        w.add_logit_scale(cfg["logits_scaling"])
    elif arch == "minicpm":
        w.add_embedding_scale(cfg["scale_emb"])
        w.add_residual_scale(cfg["scale_depth"] / math.sqrt(cfg["num_hidden_layers"]))
        w.add_logit_scale(cfg["hidden_size"] / cfg["dim_model_base"])
    elif arch == "gemma2":
        assert cfg["query_pre_attn_scalar"] == head_dim  # what llama.cpp assumes below 27B
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
        w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
        w.add_sliding_window(cfg["sliding_window"])
    elif arch == "phi3":
        orig = cfg["original_max_position_embeddings"]
        w.add_rope_scaling_orig_ctx_len(orig)
        scale = cfg["max_position_embeddings"] / orig
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(orig)))
    else:
        raise ValueError(arch)
    # llama.cpp permutes q/k rows only in its Llama-style converters (granite, minicpm).
    perm = {"attn_q": heads, "attn_k": kv} if arch in ("granite", "minicpm") else {}
    if arch == "phi3":
        rs = cfg["rope_scaling"]
        w.add_tensor("rope_factors_long.weight", np.array(rs["long_factor"], dtype=np.float32))
        w.add_tensor("rope_factors_short.weight", np.array(rs["short_factor"], dtype=np.float32))
    for hf in sorted(weights, key=mgg._tensor_order):
        g = gguf_name(hf, arch)
        data = weights[hf]
        stem = g.rsplit(".", 1)[0].split(".")[-1]
        if stem in perm:
            data = mgg.permute(data, perm[stem])
        w.add_tensor(g, data + np.float32(shift(hf)) if shift(hf) else data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    back = mx.load(str(path))
    for hf, v in weights.items():
        g = gguf_name(hf, arch)
        got = np.array(back[g])
        stem = g.rsplit(".", 1)[0].split(".")[-1]
        if stem in perm:
            n = perm[stem]
            got = got.reshape(n, got.shape[0] // n // 2, 2, *got.shape[1:]).swapaxes(1, 2).reshape(got.shape)
        if shift(hf):
            got = got - np.float32(shift(hf))
        assert np.array_equal(got, v), (src, hf)
    print(f"wrote {path.relative_to(HERE.parent)} ({path.stat().st_size} bytes)")


def main():
    mx.set_default_device(mx.cpu)
    for src in ("granite", "minicpm", "phi3", "gemma2-gguf"):
        write(src)


if __name__ == "__main__":
    main()
