#!/usr/bin/env python3
"""Gemma 3 (text) parity goldens from the pinned oracle (mlx 0.32.2 / mlx-lm 0.32.2).

Usage (from the repo root):
    .venv/bin/python goldens/make_gemma3_goldens.py

Writes (deterministic, ~1 min on 2 CPU cores):
    goldens/models/gemma3-text/      tiny random-weight `gemma3_text` model (float32, tied)
    goldens/models/gemma3-wrapped/   the same weights as a `gemma3` checkpoint: text part under
                                     `text_config`, tensors prefixed `language_model.`, plus a
                                     stray `vision_tower.*` tensor that sanitize must drop
    goldens/gemma3.json              same schema as the llama goldens (see goldens/README.md)

The model has a sliding window of 8 and sliding_window_pattern 3 over 6 layers (layers 2 and 5
global), so prompts + generations run well past the window and every sliding layer's ring
buffer wraps, in single-sequence generation and while rows are batched.
"""

import json
import shutil
import sys
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import make_goldens as mg  # noqa: E402
import mlx_lm  # noqa: E402
import mlx_lm.utils as lm_utils  # noqa: E402

NAME = "gemma3"
TEXT_DIR = mg.MODELS_DIR / "gemma3-text"
WRAPPED_DIR = mg.MODELS_DIR / "gemma3-wrapped"
SEED = 1101

CONFIG = {
    "model_type": "gemma3_text",
    "architectures": ["Gemma3ForCausalLM"],
    "hidden_size": 64,
    "num_hidden_layers": 6,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "rms_norm_eps": 1e-6,
    "vocab_size": 512,
    "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0,
    # global layers only (mlx-lm applies rope_scaling to them, not to sliding layers)
    "rope_scaling": {"rope_type": "linear", "factor": 2.0},
    # != head_dim so a wrong attention scale shows
    "query_pre_attn_scalar": 48,
    "sliding_window": 8,
    "sliding_window_pattern": 3,
    "max_position_embeddings": 4096,
    "bos_token_id": 2,
    "eos_token_id": 1,
    "torch_dtype": "float32",
}
# embed x1: with the sqrt(hidden) input scaling and tied output, larger embeddings make the
# model repeat its input; the post-norms make v/o and mlp scaling moot (kept for the record).
SCALES = dict(embed=1.0, qk=3.0, vo=4.0, mlp=4.0)


def build():
    cfg = dict(CONFIG)
    model_class, args_class = lm_utils._get_classes(cfg)
    mx.random.seed(SEED)
    model = model_class(args_class.from_dict(cfg))
    # Tied embeddings, as the real Gemma 3 checkpoints (sanitize ties when lm_head is absent).
    model.pop("lm_head")
    model.tie_word_embeddings = True
    mg._rescale(model, SCALES)
    mx.eval(model.parameters())

    for d in (TEXT_DIR, WRAPPED_DIR):
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
    lm_utils.save_model(TEXT_DIR, model)
    lm_utils.save_config(cfg, config_path=TEXT_DIR / "config.json")

    # The multimodal form: gemma3.py reads the text model from text_config and the tensors
    # under language_model.; vision tensors are dropped by its sanitize.
    weights = dict(tree_flatten(model.parameters()))
    wrapped = {f"language_model.{k}": v for k, v in weights.items()}
    wrapped["vision_tower.patch_embedding.weight"] = mx.zeros((4, 4), dtype=mx.float32)
    mx.save_safetensors(str(WRAPPED_DIR / "model.safetensors"), wrapped, metadata={"format": "mlx"})
    text_cfg = {k: v for k, v in cfg.items()
                if k not in ("model_type", "architectures", "vocab_size", "torch_dtype")}
    text_cfg["model_type"] = "gemma3_text"
    wcfg = {
        "model_type": "gemma3",
        "architectures": ["Gemma3ForConditionalGeneration"],
        "vocab_size": cfg["vocab_size"],
        "text_config": text_cfg,
        "vision_config": {"model_type": "siglip_vision_model"},
        "eos_token_id": cfg["eos_token_id"],
        "torch_dtype": "float32",
    }
    (WRAPPED_DIR / "config.json").write_text(json.dumps(wcfg, indent=4) + "\n")

    loaded, loaded_cfg = lm_utils.load_model(TEXT_DIR)
    a = dict(tree_flatten(model.parameters()))
    b = dict(tree_flatten(loaded.parameters()))
    assert a.keys() == b.keys(), set(a) ^ set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and mx.array_equal(a[k], b[k]).item(), k
    assert loaded.tie_word_embeddings
    return loaded, loaded_cfg


def check_wrapped(model, prompt):
    """The gemma3 (multimodal-form) dir gives bit-identical logits to the text dir."""
    w, _ = lm_utils.load_model(WRAPPED_DIR)
    x = mx.array([prompt])
    a, b = model(x), w(x)
    assert mx.array_equal(a, b).item(), "gemma3-wrapped logits differ"


def main():
    mx.set_default_device(mx.cpu)
    model, config = build()
    # make_goldens.goldens_tiny reads its per-model options from TINY_MODELS; register ours
    # (batch goldens on) in memory, without modifying that file.
    mg.TINY_MODELS[NAME] = {"batch": True}
    doc = mg.goldens_tiny(NAME, model, config)
    vocab = config["vocab_size"]
    draw = mg.prompt_pool(NAME + "/extra", vocab)
    # Extra single cases: a prompt much longer than the window, prefilled in chunks smaller
    # than the window (5) and larger than it (16).
    long_prompt = draw(29)
    for pss in (2048, 5, 16):
        res, _ = mg.single_greedy(model, long_prompt, 32, prefill_step_size=pss)
        doc["single"].append(res)
    # A small-chunk schedule too (5 < window): rows join while their rings are mid-wrap.
    sched = doc["schedule_chunked"]
    rows = [{k: r[k] for k in ("prompt_ids", "max_tokens", "at_step")} for r in sched["rows"]]
    s = mg.run_schedule(model, rows, 5)
    for r in s["rows"]:
        ref, _ = mg.single_greedy(model, r["prompt_ids"], max(r["max_tokens"], 24))
        r["equals_single"] = r["tokens"] == ref["tokens"][: r["max_tokens"]]
    doc["schedule_chunked5"] = s
    cfg = mg.config_summary(config)
    for k in ("query_pre_attn_scalar", "sliding_window", "sliding_window_pattern",
              "rope_local_base_freq", "rope_scaling"):
        cfg[k] = config[k]
    doc["config"] = cfg
    doc["model_dir"] = "goldens/models/gemma3-text"
    doc["wrapped_model_dir"] = "goldens/models/gemma3-wrapped"
    check_wrapped(model, long_prompt)
    mg.write_json(HERE / f"{NAME}.json", doc)
    summary = {k: [r["equals_single"] for b in doc["batch"] for r in b["rows"]] if k == "batch"
               else [r["equals_single"] for r in doc[k]["rows"]]
               for k in ("batch", "schedule", "schedule_chunked", "schedule_chunked5")}
    print("equals_single:", summary)
    print("min margins:", [round(min(s["margins"]), 4) for s in doc["single"]])
    print("tokens:", [s["tokens"][:12] for s in doc["single"]])
    print(f"wrote goldens/{NAME}.json", flush=True)


if __name__ == "__main__":
    main()
