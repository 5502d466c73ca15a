#!/usr/bin/env python3
"""RoPE-scaling and architecture parity goldens from the pinned oracle (mlx 0.32.2 / mlx-lm 0.32.2).

Usage (from the repo root):
    .venv/bin/python goldens/make_arch_goldens.py              # everything
    .venv/bin/python goldens/make_arch_goldens.py --only rope-llama3

Each entry of MODELS is a tiny random-weight model built by mlx-lm's own model class, saved
with its `save_model` / `save_config` to goldens/models/<name>/, and read back with
`load_model` (checked bit-equal), exactly as make_goldens.py builds its tiny models; the
goldens (goldens/<name>.json, make_goldens.py's schema) are single-sequence trajectories with
first-step logits, batch_generate B=2/B=4 and BatchGenerator schedules (plain and chunked).

`rope-*` models are Llama stacks that differ only in `rope_scaling`; their sizes make each
kind matter within the trajectories (short original contexts, so llama3 / yarn / longrope
change most frequencies; max_position_embeddings 16 for dynamic, so its base grows).

mlx-lm cannot batch `dynamic` RoPE (its base depends on `offset`, which is an array in a
batch), so for rope-dynamic the batch and schedule goldens are each row's single-sequence
generate_step trajectory (marked "reference": "single"), and there is no chunked schedule
(the rotation depends on how prefill is chunked).
"""

import argparse
import sys
from pathlib import Path

import mlx.core as mx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import make_goldens as mg  # noqa: E402


def llama(**kw):
    cfg = dict(
        hidden_size=64, num_hidden_layers=2, intermediate_size=128,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
        vocab_size=256, rope_theta=10000.0, max_position_embeddings=2048,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, torch_dtype="float32",
    )
    cfg.update(kw)
    return mg._base_config("llama", "LlamaForCausalLM", **cfg)


UNTIED = dict(embed=8.0, qk=3.0, lm_head=12.0)

MINISTRAL3_TEXT = dict(
    hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
    num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-5, vocab_size=256,
    max_position_embeddings=4096, tie_word_embeddings=False,
    rope_parameters={"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                     "original_max_position_embeddings": 8, "beta_fast": 32.0, "beta_slow": 1.0,
                     "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.5},
    bos_token_id=1, eos_token_id=2, torch_dtype="float32")

_GEMMA4_E2B = mg._base_config(
        "gemma4_text", "Gemma4ForCausalLM",
        hidden_size=64, num_hidden_layers=6, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, global_head_dim=32, rms_norm_eps=1e-6,
        vocab_size=256, vocab_size_per_layer_input=256, hidden_size_per_layer_input=8,
        num_kv_shared_layers=3, sliding_window=8, sliding_window_pattern=3,
        max_position_embeddings=4096, final_logit_softcapping=10.0, use_double_wide_mlp=True,
        rope_parameters={
            "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                               "rope_type": "proportional"},
            "sliding_attention": {"partial_rotary_factor": 1.0, "rope_theta": 10000.0,
                                  "rope_type": "default"}},
        tie_word_embeddings=True, bos_token_id=2, eos_token_id=1, torch_dtype="float32")

# Gemma 4 31B shape: no KV sharing or per-layer inputs; full layers use the raw keys as values
# (attention_k_eq_v) with their own head count; explicit layer_types; untied head.
_GEMMA4_31B = mg._base_config(
        "gemma4_text", "Gemma4ForCausalLM",
        hidden_size=64, num_hidden_layers=4, intermediate_size=96, num_attention_heads=4,
        num_key_value_heads=2, num_global_key_value_heads=1, head_dim=16, global_head_dim=32,
        attention_k_eq_v=True, rms_norm_eps=1e-6, vocab_size=256, hidden_size_per_layer_input=0,
        num_kv_shared_layers=0, sliding_window=8,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        max_position_embeddings=4096, final_logit_softcapping=10.0,
        rope_parameters={
            "full_attention": {"partial_rotary_factor": 0.5, "rope_theta": 1000000.0,
                               "rope_type": "proportional"},
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}},
        tie_word_embeddings=False, bos_token_id=2, eos_token_id=1, torch_dtype="float32")

MODELS = {
    "rope-linear": dict(seed=2001, config=llama(rope_scaling={"type": "linear", "factor": 2.0})),
    # Llama 3.x's scaling; original context 64 (Llama 3.1 uses 8192) so most bands change.
    "rope-llama3": dict(seed=2002, config=llama(
        rope_theta=500000.0, max_position_embeddings=1024,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
    "rope-yarn": dict(seed=2003, config=llama(
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64})),
    "rope-longrope": dict(seed=2004, config=llama(
        max_position_embeddings=256,
        rope_scaling={"type": "longrope", "original_max_position_embeddings": 32,
                      "short_factor": [1.0] * 8,
                      "long_factor": [1.0, 1.25, 1.5, 2.0, 3.0, 4.5, 6.0, 8.0]})),
    "rope-dynamic": dict(seed=2005, config=llama(
        max_position_embeddings=16, rope_scaling={"type": "dynamic", "factor": 2.0}),
        batch=False, batch_reference=True),
    "rope-mrope": dict(seed=2006, config=llama(
        rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]})),
    # Half of each head rotated, with a frequency factor.
    "rope-proportional": dict(seed=2007, config=llama(
        rope_scaling={"rope_type": "proportional", "partial_rotary_factor": 0.5, "factor": 2.0})),
    # Granite 3.x: multipliers on embeddings, residual branches, attention and logits.
    "granite": dict(seed=2101, config=mg._base_config(
        "granite", "GraniteForCausalLM",
        hidden_size=64, num_hidden_layers=2, intermediate_size=128,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=256,
        rope_theta=10000.0, max_position_embeddings=2048, attention_bias=False, mlp_bias=False,
        embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.15,
        logits_scaling=0.5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
        torch_dtype="float32"),
        scales=dict(embed=1.0, qk=3.0, lm_head=12.0)),
    # MiniCPM: scale_emb, scale_depth / sqrt(layers), untied head reads h / (hidden / base).
    "minicpm": dict(seed=2102, config=mg._base_config(
        "minicpm", "MiniCPMForCausalLM",
        hidden_size=64, num_hidden_layers=2, intermediate_size=128,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=256,
        rope_theta=10000.0, max_position_embeddings=2048, scale_emb=12.0, scale_depth=1.4,
        dim_model_base=16, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
        torch_dtype="float32"),
        scales=dict(embed=1.0, qk=3.0, lm_head=48.0)),
    # SmolLM3: Llama with NoPE on every 2nd layer here (interval 2 of 4 layers).
    "smollm3": dict(seed=2103, config=mg._base_config(
        "smollm3", "SmolLM3ForCausalLM",
        hidden_size=64, num_hidden_layers=4, intermediate_size=128,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, vocab_size=256,
        rope_theta=5000000.0, max_position_embeddings=4096, no_rope_layer_interval=2,
        tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, torch_dtype="float32"),
        scales=dict(embed=4.0, qk=3.0, vo=4.0, mlp=4.0)),
    # Phi-3 / Phi-4-mini shape: fused qkv_proj and gate_up_proj, half of each head rotated,
    # longrope past an original context of 32 (factor 256 / 32 = 8, so mscale applies).
    "phi3": dict(seed=2104, config=mg._base_config(
        "phi3", "Phi3ForCausalLM",
        hidden_size=64, num_hidden_layers=2, intermediate_size=128,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=256,
        rope_theta=10000.0, partial_rotary_factor=0.5, max_position_embeddings=256,
        original_max_position_embeddings=32,
        rope_scaling={"type": "longrope", "short_factor": [1.0, 1.0, 1.0, 1.0],
                      "long_factor": [1.0, 1.5, 3.0, 6.0]},
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, torch_dtype="float32"),
        suffix_scales={"qkv_proj.weight": 3.0}),
    # Gemma 2: soft-capped attention scores and logits (caps small enough to bite), GQA,
    # head_dim != hidden / heads, query_pre_attn_scalar != head_dim. mlx-lm's batched
    # gemma2 lines the batch mask up with the kv-head axis (wrong for GQA), so batch and
    # schedule references are single-sequence trajectories.
    "gemma2": dict(seed=2105, config=mg._base_config(
        "gemma2", "Gemma2ForCausalLM",
        hidden_size=64, num_hidden_layers=3, intermediate_size=128,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
        vocab_size=256, rope_theta=10000.0, attn_logit_softcapping=5.0,
        final_logit_softcapping=8.0, query_pre_attn_scalar=48, sliding_window=4096,
        max_position_embeddings=8192, bos_token_id=2, eos_token_id=1, torch_dtype="float32"),
        scales=dict(embed=0.25, qk=3.0, vo=8.0, mlp=8.0), batch=False, batch_reference=True,
        chunked_reference=True),
    # Gemma 2 as llama.cpp can express it (goldens/gguf/gemma2-f32.gguf): llama.cpp scales
    # queries by head_dim^-0.5 for every Gemma 2 but the 27B, so query_pre_attn_scalar =
    # head_dim; norm weights on a 2^-16 grid so llama.cpp's stored 1 + w gives w back exactly.
    "gemma2-gguf": dict(seed=2110, config=mg._base_config(
        "gemma2", "Gemma2ForCausalLM",
        hidden_size=64, num_hidden_layers=3, intermediate_size=128,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
        vocab_size=256, rope_theta=10000.0, attn_logit_softcapping=5.0,
        final_logit_softcapping=8.0, query_pre_attn_scalar=32, sliding_window=4096,
        max_position_embeddings=8192, bos_token_id=2, eos_token_id=1, torch_dtype="float32"),
        scales=dict(embed=0.25, qk=3.0, vo=8.0, mlp=8.0), batch=False, batch_reference=True,
        chunked_reference=True, round_norms=True),
    # Ministral 3: rope_parameters (yarn) and Llama 4 query scaling that steps every 8
    # positions (original context 8), so prompts and generations cross several steps.
    "ministral3": dict(seed=2106, config=mg._base_config(
        "ministral3", "Ministral3ForCausalLM", **MINISTRAL3_TEXT)),
    # The same text model inside a mistral3 (multimodal-form) checkpoint: text_config, tensors
    # under language_model. as mlx-lm saves them.
    "mistral3": dict(seed=2107, config=mg._base_config(
        "mistral3", "Mistral3ForConditionalGeneration",
        text_config=dict(MINISTRAL3_TEXT, model_type="ministral3"),
        vocab_size=MINISTRAL3_TEXT["vocab_size"], eos_token_id=2, torch_dtype="float32")),
    # Gemma 4 text (E2B/E4B shape): 6 layers [S, S, F, S, S, F] (pattern 3), the last 3 share
    # K/V with the last earlier layer of their kind (3, 4 -> 1; 5 -> 2), so the double-wide MLP
    # applies there; per-layer inputs; full layers with global_head_dim 32 and proportional
    # RoPE over a quarter of it; sliding window 8 so prompts and generations cross it;
    # v_norm, q/k norms, attention scale 1, layer scalars, final softcap small enough to bite.
    "gemma4_text": dict(seed=2108, config=_GEMMA4_E2B,
        scales=dict(embed=0.5, qk=3.0, vo=8.0, mlp=8.0),
        suffix_scales={"layer_scalar": 0.75, "per_layer_input_gate.weight": 3.0,
                       "per_layer_model_projection.weight": 3.0}),
    # The E2B-like model in bfloat16 (as released checkpoints are): the Python-float scales
    # (embeddings, per-layer inputs, softcap) rounded to bfloat16 as mlx-lm rounds them.
    "gemma4_text-bf16": dict(seed=2108, dtype="bfloat16", config=dict(
        _GEMMA4_E2B, torch_dtype="bfloat16"),
        scales=dict(embed=0.5, qk=3.0, vo=8.0, mlp=8.0),
        suffix_scales={"layer_scalar": 0.75, "per_layer_input_gate.weight": 3.0,
                       "per_layer_model_projection.weight": 3.0},
        batch=False, batch_reference=True),
    # Gemma 4 31B shape (_GEMMA4_31B above).
    "gemma4_text-kv": dict(seed=2109, config=_GEMMA4_31B,
        scales=dict(embed=0.5, qk=3.0, lm_head=4.0),
        suffix_scales={"layer_scalar": 0.75}),
    # Gemma 4 26B-A4B shape: the 31B-like stack with the MoE block on every layer (router:
    # RMSNorm with a learned scale, top-2 of 8 experts, softmax, per-expert scale; GeGLU
    # experts of width 32 beside the dense MLP, mlx-lm's SwitchGLU through gather_mm, sorted
    # once 64 (token, expert) pairs are routed). Router sharpened so the choice follows the
    # token. Float32 (MLX's CPU gather_mm is float32-only).
    "gemma4_text-moe": dict(seed=2110, config=dict(
        _GEMMA4_31B, enable_moe_block=True, num_experts=8, top_k_experts=2, moe_intermediate_size=32),
        scales=dict(embed=0.5, qk=3.0, lm_head=4.0, mlp=2.0),
        suffix_scales={"layer_scalar": 0.75, "router.proj.weight": 6.0}),
    # The same shape with 4-bit g64 experts (QuantizedSwitchLinear -> gather_qmm) and an 8-bit
    # router (the model's quant_predicate); moe_intermediate 64 so the experts' down_proj
    # quantizes too.
    "gemma4_text-moe-4bit": dict(seed=2111, config=dict(
        _GEMMA4_31B, enable_moe_block=True, num_experts=8, top_k_experts=2, moe_intermediate_size=64),
        scales=dict(embed=0.5, qk=3.0, lm_head=4.0, mlp=2.0),
        suffix_scales={"layer_scalar": 0.75, "router.proj.weight": 6.0},
        quantize=dict(group_size=64, bits=4, overrides={
            f"model.layers.{i}.router.proj": {"group_size": 64, "bits": 8} for i in range(4)})),
}


def batch_reference(name, model, config, doc, chunked=False):
    """batch / schedule goldens as single-sequence trajectories (same prompts as goldens_tiny)."""
    draw = mg.prompt_pool(name + "/batch", config["vocab_size"])

    def single(p, n, pss=2048):
        r, _ = mg.single_greedy(model, p, n, prefill_step_size=pss)
        return r

    batches = []
    for lens, mts in (([7, 13], [16, 16]), ([1, 9, 23, 4], [16, 12, 16, 10])):
        rows = []
        for L, m in zip(lens, mts):
            p = draw(L)
            r = single(p, m)
            rows.append({"prompt_ids": p, "max_tokens": m, "tokens": r["tokens"],
                         "equals_single": True, "first_logprobs": r["first_logprobs"]})
        batches.append({"batch_size": len(rows), "rows": rows})
    doc["note_batch"] = "reference: single - each row's generate_step trajectory (mlx-lm cannot batch this model)"
    doc["batch"] = batches
    # The base follows each forward's length (offset + L), so a trajectory depends on how
    # the prompt was cut into chunks; a batch cuts a joining row's prompt its own way, so
    # only unchunked schedules have a single-sequence reference.
    sched = [(9, 12, 0), (1, 8, 0), (17, 10, 3), (5, 6, 6), (40, 8, 6)]
    rows = []
    for i, (L, m, at) in enumerate(sched):
        p = draw(L)
        rows.append({"id": i, "prompt_ids": p, "max_tokens": m, "at_step": at,
                     "tokens": single(p, m)["tokens"], "finish_reason": "length", "equals_single": True})
    doc["schedule"] = {"prefill_step_size": 2048, "reference": "single", "rows": rows}
    doc.pop("schedule_chunked", None)
    if chunked:
        # Chunking does not change full attention: the same references, prefilled by 8.
        doc["schedule_chunked"] = dict(doc["schedule"], prefill_step_size=8)


def make(name):
    spec = dict(MODELS[name])
    spec.setdefault("dtype", "float32")
    spec.setdefault("scales", UNTIED)
    spec.setdefault("batch", True)
    mg.TINY_MODELS[name] = spec
    rescale = mg._rescale
    extra = spec.get("suffix_scales", {})

    def rescale_with_extra(model, scales):
        # make_goldens' rescale, plus weights it does not know by name (fused projections).
        rescale(model, scales)
        from mlx.utils import tree_map_with_path
        if spec.get("round_norms"):
            model.update(tree_map_with_path(
                lambda p, w: mx.round(w * 65536.0) / 65536.0 if p.endswith("norm.weight") else w,
                model.parameters()))
        model.update(tree_map_with_path(
            lambda p, w: w * next((f for suf, f in extra.items() if p.endswith(suf)), 1.0),
            model.parameters()))
        mx.eval(model.parameters())

    mg._rescale = rescale_with_extra
    try:
        model, config = mg.build_tiny(name)
    finally:
        mg._rescale = rescale
    doc = mg.goldens_tiny(name, model, config)
    if spec.get("batch_reference"):
        batch_reference(name, model, config, doc, chunked=spec.get("chunked_reference", False))
    cfg = mg.config_summary(config)
    for k in ("rope_scaling", "rope_parameters", "text_config", "max_position_embeddings", "embedding_multiplier", "residual_multiplier",
              "attention_multiplier", "logits_scaling", "scale_emb", "scale_depth", "dim_model_base",
              "no_rope_layer_interval", "no_rope_layers", "partial_rotary_factor",
              "original_max_position_embeddings", "attn_logit_softcapping", "final_logit_softcapping",
              "query_pre_attn_scalar", "global_head_dim", "num_kv_shared_layers",
              "hidden_size_per_layer_input", "vocab_size_per_layer_input", "sliding_window",
              "sliding_window_pattern", "use_double_wide_mlp", "attention_k_eq_v",
              "num_global_key_value_heads", "layer_types", "enable_moe_block", "num_experts",
              "top_k_experts", "moe_intermediate_size"):
        if k in config:
            cfg[k] = config[k]
    doc["config"] = cfg
    mg.write_json(HERE / f"{name}.json", doc)
    print(f"[goldens] {name}: min margins",
          [round(min(s["margins"]), 4) for s in doc["single"]],
          "equals_single", [r["equals_single"] for b in doc["batch"] for r in b["rows"]],
          [r["equals_single"] for r in doc["schedule"]["rows"]], flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", action="append", default=[], help=", ".join(MODELS))
    args = ap.parse_args()
    names = args.only or list(MODELS)
    for n in names:
        if n not in MODELS:
            ap.error(f"unknown model {n}")
    mx.set_default_device(mx.cpu)
    for n in names:
        make(n)


if __name__ == "__main__":
    main()
