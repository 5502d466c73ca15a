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
}


def batch_reference(name, model, config, doc):
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


def make(name):
    spec = dict(MODELS[name])
    spec.setdefault("dtype", "float32")
    spec.setdefault("scales", UNTIED)
    spec.setdefault("batch", True)
    mg.TINY_MODELS[name] = spec
    model, config = mg.build_tiny(name)
    doc = mg.goldens_tiny(name, model, config)
    if spec.get("batch_reference"):
        batch_reference(name, model, config, doc)
    cfg = mg.config_summary(config)
    for k in ("rope_scaling", "max_position_embeddings", "embedding_multiplier", "residual_multiplier",
              "attention_multiplier", "logits_scaling", "scale_emb", "scale_depth", "dim_model_base",
              "no_rope_layer_interval", "no_rope_layers"):
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
