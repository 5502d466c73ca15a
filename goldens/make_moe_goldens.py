#!/usr/bin/env python3
"""Weft parity goldens for mixture-of-experts models (mlx-lm `qwen3_moe`).

Usage (from the repo root):
    .venv/bin/python goldens/make_moe_goldens.py [--only qwen3_moe | --only qwen3_moe-4bit]

Builds tiny random-weight qwen3_moe models with mlx-lm's own classes and records the same
goldens as make_goldens.py (single-sequence trajectories with first-step logits, batch_generate
B=2/B=4, BatchGenerator continuous schedules). Same JSON schema as goldens/llama-fp32.json.
Deterministic: re-running rewrites byte-identical files.

- qwen3_moe:       float32; 3 layers, 8 experts top-2 (norm_topk_prob), decoder_sparse_step 1,
                   mlp_only_layers [1] (layer 1 is a dense MLP, layers 0 and 2 are MoE).
- qwen3_moe-4bit:  affine 4-bit g64 everywhere (SwitchGLU experts -> gather_qmm), the router
                   `mlp.gate` at 8 bits g64 (qwen3_moe's own quant_predicate);
                   decoder_sparse_step 2 (layer 1 MoE, layers 0 and 2 dense).

The 40-token prompt prefills 39 tokens at once: 39 * 2 expert indices >= 64, so SwitchGLU takes
its sort-by-expert path (`_gather_sort` / `sorted_indices=True`); shorter forwards do not.
"""

import argparse
import shutil
import sys
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map_with_path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import make_goldens as mg  # noqa: E402
import mlx_lm.utils as lm_utils  # noqa: E402

# Quantized experts run through mlx-lm's own QuantizedSwitchLinear: it passes `global_scale=`
# to mx.gather_qmm, which MLX accepts from 0.32.3 (the pinned 0.32.2 before did not, and this
# script patched that call out; the goldens it made are unchanged without the patch).
assert tuple(map(int, mx.__version__.split(".")[:3])) >= (0, 32, 3), mx.__version__


def _cfg(**kw):
    base = dict(
        model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"],
        hidden_size=64, num_hidden_layers=3, intermediate_size=128,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
        vocab_size=1024, rope_theta=1000000.0, max_position_embeddings=4096,
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=3,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
        norm_topk_prob=True, torch_dtype="float32",
    )
    base.update(kw)
    return {k: v for k, v in base.items() if v is not None}


MOE_MODELS = {
    "qwen3_moe": dict(
        seed=2001,
        config=_cfg(decoder_sparse_step=1, mlp_only_layers=[1]),
        scales=dict(embed=8.0, qk=3.0, lm_head=12.0, router=6.0),
        batch=True,
    ),
    "qwen3_moe-4bit": dict(
        seed=2002,
        config=_cfg(decoder_sparse_step=2, mlp_only_layers=[]),
        scales=dict(embed=8.0, qk=3.0, lm_head=12.0, router=6.0),
        quantize=dict(group_size=64, bits=4),
        batch=True,
    ),
}


def build_moe(name):
    spec = MOE_MODELS[name]
    cfg = dict(spec["config"])
    model_class, args_class = lm_utils._get_classes(cfg)
    mx.random.seed(spec["seed"])
    model = model_class(args_class.from_dict(cfg))
    mg._rescale(model, spec["scales"])
    # Sharper routing than the default init, so expert choice depends on the token.
    router = spec["scales"]["router"]
    model.update(tree_map_with_path(
        lambda p, w: w * router if p.endswith("mlp.gate.weight") else w, model.parameters()))
    mx.eval(model.parameters())
    if "quantize" in spec:
        q = spec["quantize"]
        model, cfg = lm_utils.quantize_model(model, cfg, group_size=q["group_size"], bits=q["bits"],
                                             mode="affine")
        assert "model.layers.1.mlp.gate" in cfg["quantization"], cfg["quantization"]
    mx.eval(model.parameters())

    out = mg.MODELS_DIR / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    lm_utils.save_model(out, model)
    lm_utils.save_config(cfg, config_path=out / "config.json")

    loaded, loaded_cfg = lm_utils.load_model(out)
    a = dict(tree_flatten(model.parameters()))
    b = dict(tree_flatten(loaded.parameters()))
    assert a.keys() == b.keys(), (name, set(a) ^ set(b))
    for k in a:
        assert a[k].dtype == b[k].dtype and mx.array_equal(a[k], b[k]).item(), (name, k)
    return loaded, loaded_cfg


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", action="append", default=[], help=", ".join(MOE_MODELS))
    args = ap.parse_args()
    names = args.only or list(MOE_MODELS)
    mx.set_default_device(mx.cpu)
    for name in names:
        if name not in MOE_MODELS:
            ap.error(f"unknown model {name}")
        print(f"[moe goldens] {name}", flush=True)
        model, config = build_moe(name)
        # goldens_tiny reads the batch flag from make_goldens.TINY_MODELS.
        mg.TINY_MODELS[name] = MOE_MODELS[name]
        doc = mg.goldens_tiny(name, model, config)
        summary = doc["config"]
        for k in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
                  "decoder_sparse_step", "mlp_only_layers"):
            summary[k] = config[k]
        mg.write_json(HERE / f"{name}.json", doc)
        print(f"[moe goldens] wrote goldens/{name}.json", flush=True)


if __name__ == "__main__":
    main()
