#!/usr/bin/env python3
"""GGUF parity goldens: tiny GGUF checkpoints of every tensor type Weft loads, and what mlx-lm
generates from them.

Usage (from the repo root):
    scripts/setup && .venv/bin/python goldens/make_gguf_goldens.py [--only NAME ...]

For each entry of GGUF_FILES (llama-f32, llama-f16, llama-q8_0, llama-q4_0, llama-q4_1,
qwen3-q8_0, mistral-q4_0) this script

1. writes goldens/gguf/<name>.gguf from a committed tiny mlx-lm model (goldens/models/...)
   with gguf-py's GGUFWriter, the way llama.cpp's convert_hf_to_gguf.py lays a checkpoint
   out: llama.cpp tensor names, q/k rows permuted for llama (`permute` below, n_head for
   attn_q, n_head_kv for attn_k; qwen3 is not permuted), `<arch>.*` metadata, 1-D tensors
   (norms) F32, matrices of the file's type (quantized with gguf-py's reference
   `gguf.quants.quantize`), and token_embd Q8_0 in the Q4_0 / Q4_1 files;
2. checks the tensors as MLX reads them back (`mx.load`, MLX's own GGUF reader, which turns
   Q4_0 / Q4_1 / Q8_0 into affine weight/scales/biases triples, group 32) against the source
   model: F32 exactly, F16 = the fp16 rounding exactly, quantized = gguf-py's reference
   dequantisation exactly and close to the fp32 weights (after un-permuting q/k; without the
   un-permutation q/k must be far off, so a wrong permutation cannot pass);
3. converts the GGUF back into an mlx-lm model dir (goldens/.work/gguf/<name>/, git-ignored)
   with the same decisions as make_goldens.py's SmolLM2 conversion (its gguf_to_hf_name /
   unpermute_rows; scales/biases and float tensors to float32; Q4_x -> 4-bit, Q8_0 -> 8-bit,
   group 32). For llama-q4_1 (which carries a tiny tokenizer and so has everything
   make_goldens.convert_gguf needs) the result is also checked tensor-for-tensor against
   make_goldens.convert_gguf itself;
4. records greedy generate_step trajectories (24 tokens, EOS ignored) and the full first-step
   logits for 3 prompts (1, 6 and 23 tokens) into goldens/gguf/<name>.json, with the schema of
   the "single" entries of goldens/<tiny>.json (see goldens/README.md).

Everything is deterministic: re-running rewrites byte-identical files.
"""

import argparse
import hashlib
import json
import random
import shutil
import sys
from pathlib import Path

import numpy as np

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

import mlx_lm
import mlx_lm.utils as lm_utils

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import make_goldens as mg  # noqa: E402  (the SmolLM2 GGUF conversion and the golden helpers)

import gguf  # noqa: E402
from gguf import GGMLQuantizationType as T  # noqa: E402

OUT_DIR = HERE / "gguf"
WORK_DIR = HERE / ".work" / "gguf"

SINGLE_MAX_TOKENS = mg.SINGLE_MAX_TOKENS  # 24
PROMPT_LENS = [1, 6, 23]

# name -> (source model under goldens/models, GGUF arch, matrix type, token_embd type, tokenizer)
GGUF_FILES = {
    "llama-f32": ("llama-fp32", "llama", T.F32, T.F32, False),
    "llama-f16": ("llama-fp32", "llama", T.F16, T.F16, False),
    "llama-q8_0": ("llama-fp32", "llama", T.Q8_0, T.Q8_0, False),
    "llama-q4_0": ("llama-fp32", "llama", T.Q4_0, T.Q8_0, False),
    "llama-q4_1": ("llama-fp32", "llama", T.Q4_1, T.Q8_0, True),
    "qwen3-q8_0": ("qwen3", "qwen3", T.Q8_0, T.Q8_0, False),
    # llama arch with head_dim 32 != hidden 64 / 4 heads (attention.key_length) and one KV head:
    # the permutation over n_head_kv = 1.
    "mistral-q4_0": ("mistral-fp32", "llama", T.Q4_0, T.Q8_0, False),
}

FILE_TYPE = {  # general.file_type (llama_ftype) as convert_hf_to_gguf.py writes it
    T.F32: gguf.LlamaFileType.ALL_F32,
    T.F16: gguf.LlamaFileType.MOSTLY_F16,
    T.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0,
    T.Q4_0: gguf.LlamaFileType.MOSTLY_Q4_0,
    T.Q4_1: gguf.LlamaFileType.MOSTLY_Q4_1,
}

# HF module (within a layer) -> llama.cpp name; inverse of make_goldens.GGUF_BLOCK_MAP plus
# qwen3's per-head q/k RMSNorms.
QK_NORMS = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
HF_TO_GGUF_BLOCK = {v: k for k, v in {**mg.GGUF_BLOCK_MAP, **QK_NORMS}.items()}


# --------------------------------------------------------------------------------------
# Names and the q/k permutation
# --------------------------------------------------------------------------------------

def gguf_name(hf):
    """HF / mlx-lm tensor name -> llama.cpp GGUF name."""
    stem, suffix = hf.rsplit(".", 1)
    top = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    if stem in top:
        return f"{top[stem]}.{suffix}"
    parts = stem.split(".", 3)
    assert parts[:2] == ["model", "layers"], hf
    return f"blk.{int(parts[2])}.{HF_TO_GGUF_BLOCK[parts[3]]}.{suffix}"


def hf_name(name):
    """GGUF name -> HF name: make_goldens.gguf_to_hf_name, plus qwen3's attn_q/k_norm."""
    stem, suffix = name.rsplit(".", 1)
    parts = stem.split(".")
    if parts[0] == "blk" and len(parts) == 3 and parts[2] in QK_NORMS:
        return f"model.layers.{int(parts[1])}.{QK_NORMS[parts[2]]}.{suffix}"
    return mg.gguf_to_hf_name(name)


def permute(w, n_head):
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute (numpy, rows of a 2-D weight)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2)
            .reshape(w.shape))


def permute_heads(arch, cfg):
    """{GGUF stem suffix: n_head} of the rows llama.cpp permutes for this arch (none for qwen3)."""
    if arch != "llama":
        return {}
    return {"attn_q": cfg["num_attention_heads"], "attn_k": cfg["num_key_value_heads"]}


# --------------------------------------------------------------------------------------
# A tiny byte-level BPE tokenizer (llama-q4_1 only): 3 control tokens, the 256 byte tokens,
# then merges learned on a fixed pseudo-random stream of English and made-up words, to the
# model's vocab size.
# --------------------------------------------------------------------------------------

TOKENIZER_WORDS = (
    "the of and to in is that it for on with as was by at be this from or an are not have "
    "but one all were when there can more which their if will each about how up out them "
    "then she many some so these would other into has two like him see time could no make "
    "than first been its who now people my made over did down only way find use may water "
    "long little very after words called just where most know get through back much before "
    "go good new write our used me man too any day same right look think also around another "
    "came come work three word must because does part even place well such here take why "
    "things help put years different away again off went old number great tell men say small "
    "every found still between name should home big give air line set own under read last "
    "never us left end along while might next sound below saw something thought both few "
    "those always looked show large often together asked house world going want school "
    "important until form food keep children feet land side without boy once animals life "
    "enough took sometimes four head above kind began almost live page got earth need far "
    "hand high year mother light parts country father let night following picture being "
    "study second eyes soon times story boys since white days paper hard near sentence "
    "better best across during today others however sure means knew why try told young "
    "mountains river city capital France Paris 2024 3.14 hello world Weft MLX GGUF"
).split()
TINY_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOKENIZER_SAMPLES = ["Hello world", "The capital of France is Paris.", "numbers 2024 and 3.14",
                     "<|im_start|>user\nhi<|im_end|>\n", "naïve café"]


def _byte_chars():
    printable = [b for b in range(256) if ord("!") <= b <= ord("~") or 0xA1 <= b <= 0xAC or 0xAE <= b <= 0xFF]
    chars, n = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(0x100 + n)
            n += 1
    return chars


def tiny_tokenizer(vocab_size):
    """(tokens, merges, token_types): ids 0..2 control, 3..258 bytes (type 1), then merges."""
    byte_char = _byte_chars()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    rng = random.Random("weft-gguf-goldens/tokenizer")
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    vocab_words = TOKENIZER_WORDS + ["".join(rng.choice(syllables) for _ in range(rng.randint(2, 4)))
                                     for _ in range(600)]
    counts = {}
    for _ in range(8000):
        w = rng.choice(vocab_words)
        w = ("Ġ" if rng.random() < 0.8 else "") + "".join(byte_char[b] for b in w.encode())
        counts[w] = counts.get(w, 0) + 1
    words = {tuple(w): c for w, c in sorted(counts.items())}
    tokens = specials + [byte_char[b] for b in range(256)]
    merges = []
    while len(tokens) < vocab_size:
        pairs = {}
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] = pairs.get((a, b), 0) + c
        if not pairs:
            raise RuntimeError("tokenizer corpus too small for the vocabulary")
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], [-ord(ch) for ch in kv[0][0] + " " + kv[0][1]]))
        merges.append(f"{a} {b}")
        tokens.append(a + b)
        new = {}
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new[tuple(out)] = new.get(tuple(out), 0) + c
        words = new
    assert len(set(tokens)) == len(tokens)
    types = [3] * len(specials) + [1] * (len(tokens) - len(specials))
    return tokens, merges, types


# --------------------------------------------------------------------------------------
# Writing a GGUF from an mlx-lm model
# --------------------------------------------------------------------------------------

def load_source(model_name):
    model, cfg = lm_utils.load_model(mg.MODELS_DIR / model_name)
    weights = {k: np.array(v) for k, v in tree_flatten(model.parameters())}
    for k, v in weights.items():
        assert v.dtype == np.float32, (model_name, k, v.dtype)
    return weights, cfg


def write_gguf(name, path):
    src, arch, mat_type, embd_type, with_tokenizer = GGUF_FILES[name]
    weights, cfg = load_source(src)
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    perm = permute_heads(arch, cfg)

    w = gguf.GGUFWriter(str(path), arch)
    w.add_type("model")
    w.add_name(f"weft-tiny-{src}")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    if arch == "llama":
        w.add_rope_dimension_count(head_dim)
    w.add_head_count(heads)
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    if head_dim != cfg["hidden_size"] // heads:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type(FILE_TYPE[mat_type])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    if with_tokenizer:
        tokens, merges, types = tiny_tokenizer(cfg["vocab_size"])
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("smollm")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
        w.add_pad_token_id(2)
        w.add_add_bos_token(False)
        w.add_add_space_prefix(False)
        w.add_chat_template(TINY_TEMPLATE)
    else:
        # config.json's eos (llama-fp32's generation_config.json list [2, 5] is not in a GGUF).
        eos = json.loads((mg.MODELS_DIR / src / "config.json").read_text())["eos_token_id"]
        w.add_eos_token_id(eos)

    types = {}
    for hf in sorted(weights, key=_tensor_order):
        g = gguf_name(hf)
        data = weights[hf]
        stem = g.rsplit(".", 1)[0].split(".")[-1]
        if stem in perm:
            data = permute(data, perm[stem])
        if data.ndim == 1:
            qtype = T.F32
        elif g == "token_embd.weight":
            qtype = embd_type
        else:
            qtype = mat_type
        if qtype == T.F32:
            w.add_tensor(g, data)
        elif qtype == T.F16:
            w.add_tensor(g, data.astype(np.float16))
        else:
            w.add_tensor(g, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        types[g] = qtype.name
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return weights, cfg, types


def _tensor_order(hf):
    """token_embd, then the blocks in order, then output_norm and output."""
    if hf.startswith("model.embed_tokens"):
        return (0, 0, hf)
    if hf.startswith("model.layers."):
        return (1, int(hf.split(".")[2]), hf)
    return (2, 0 if hf.startswith("model.norm") else 1, hf)


# --------------------------------------------------------------------------------------
# Reading it back: MLX's GGUF reader vs the source weights
# --------------------------------------------------------------------------------------

GROUP = mg.GGUF_GROUP_SIZE  # 32
BITS = {"Q8_0": 8, "Q4_0": 4, "Q4_1": 4}


def check_dequantized(name, path, weights, cfg, types):
    """mx.load's tensors, dequantised and un-permuted, against the source fp32 weights."""
    arrays, _ = mx.load(str(path), return_metadata=True)
    arch = GGUF_FILES[name][1]
    perm = permute_heads(arch, cfg)
    reader = gguf.GGUFReader(str(path))
    raw = {t.name: t for t in reader.tensors}
    report = {}
    for g, ttype in types.items():
        orig = weights[hf_name(g)]
        stem = g.rsplit(".", 1)[0].split(".")[-1]
        if ttype in BITS:
            wq = arrays[g]
            assert wq.dtype == mx.uint32, (g, wq.dtype)
            got = mx.dequantize(wq, arrays[g[: -len("weight")] + "scales"].astype(mx.float32),
                                arrays[g[: -len("weight")] + "biases"].astype(mx.float32),
                                group_size=GROUP, bits=BITS[ttype])
            got = np.array(got)
            ref = gguf.quants.dequantize(np.asarray(raw[g].data), T[ttype]).reshape(got.shape)
            assert np.array_equal(got, ref.astype(np.float32)), f"{name} {g}: MLX != gguf-py dequant"
        else:
            got = np.array(arrays[g].astype(mx.float32))
        if stem in perm:
            unperm = np.array(mg.unpermute_rows(mx.array(got), perm[stem]))
            wrong = _rel_err(got, orig)
            got = unperm
        rel = _rel_err(got, orig)
        if ttype == "F32":
            assert np.array_equal(got, orig), (name, g)
        elif ttype == "F16":
            assert np.array_equal(got, orig.astype(np.float16).astype(np.float32)), (name, g)
        else:
            tol = {"Q8_0": 0.01, "Q4_0": 0.2, "Q4_1": 0.2}[ttype]
            assert rel < tol, (name, g, ttype, rel)
        if stem in perm:
            assert wrong > 0.5, f"{name} {g}: the permutation did not move rows (rel err {wrong})"
        report[g] = rel
    assert set(k for k in arrays if k.endswith(".weight")) == set(types), name
    worst = max(report.items(), key=lambda kv: kv[1])
    print(f"[gguf]   dequantised vs fp32: worst relative error {worst[1]:.4f} ({worst[0]})", flush=True)


def _rel_err(a, b):
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b.astype(np.float64)))


# --------------------------------------------------------------------------------------
# GGUF -> mlx-lm model dir (make_goldens.convert_gguf's decisions, any of our arches/types)
# --------------------------------------------------------------------------------------

def convert(path, out_dir):
    weights, md = mx.load(str(path), return_metadata=True)
    arch = md["general.architecture"]
    assert arch in ("llama", "qwen3"), arch
    n_head = mg._md_int(md, f"{arch}.attention.head_count")
    n_kv = mg._md_int(md, f"{arch}.attention.head_count_kv")
    hidden = mg._md_int(md, f"{arch}.embedding_length")
    key_len = f"{arch}.attention.key_length"
    head_dim = mg._md_int(md, key_len) if key_len in md else hidden // n_head

    out_w = {}
    for name, arr in weights.items():
        hf = hf_name(name)
        if arch == "llama" and ".self_attn.q_proj." in hf:
            arr = mg.unpermute_rows(arr, n_head)
        elif arch == "llama" and ".self_attn.k_proj." in hf:
            arr = mg.unpermute_rows(arr, n_kv)
        if arr.dtype in (mx.float16, mx.bfloat16):
            arr = arr.astype(mx.float32)
        out_w[hf] = arr

    # Bits per module from the packed width; the commonest is the default, others override.
    bits_of = {}
    for k in out_w:
        if k.endswith(".scales"):
            p = k[: -len(".scales")]
            bits_of[p] = out_w[p + ".weight"].shape[-1] * 32 // (out_w[k].shape[-1] * GROUP)
    quantization = None
    if bits_of:
        counts = {}
        for b in bits_of.values():
            counts[b] = counts.get(b, 0) + 1
        default_bits = max(counts, key=lambda b: (counts[b], -b))
        quantization = {"group_size": GROUP, "bits": default_bits, "mode": "affine"}
        for p, b in sorted(bits_of.items()):
            if b != default_bits:
                quantization[p] = {"group_size": GROUP, "bits": b, "mode": "affine"}

    config = {
        "model_type": arch,
        "hidden_size": hidden,
        "num_hidden_layers": mg._md_int(md, f"{arch}.block_count"),
        "intermediate_size": mg._md_int(md, f"{arch}.feed_forward_length"),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv,
        "head_dim": head_dim,
        "rms_norm_eps": mg._md_float(md, f"{arch}.attention.layer_norm_rms_epsilon"),
        "rope_theta": mg._md_float(md, f"{arch}.rope.freq_base"),
        "max_position_embeddings": mg._md_int(md, f"{arch}.context_length"),
        "vocab_size": mg._md_int(md, f"{arch}.vocab_size"),
        "tie_word_embeddings": "lm_head.weight" not in out_w,
        "torch_dtype": "float32",
    }
    if arch == "llama":
        config["rope_traditional"] = False
    if "tokenizer.ggml.eos_token_id" in md:
        config["eos_token_id"] = mg._md_int(md, "tokenizer.ggml.eos_token_id")
    if quantization:
        config["quantization"] = quantization

    model_class, args_class = lm_utils._get_classes(config)
    model = model_class(args_class.from_dict(config))
    if quantization:
        def class_predicate(p, m):
            if p in quantization:
                return quantization[p]
            return hasattr(m, "to_quantized") and f"{p}.scales" in out_w

        nn.quantize(model, group_size=GROUP, bits=quantization["bits"], mode="affine",
                    class_predicate=class_predicate)
    model.load_weights(list(out_w.items()), strict=True)
    mx.eval(model.parameters())

    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    lm_utils.save_model(out_dir, model)
    lm_utils.save_config(dict(config), config_path=out_dir / "config.json")

    # Goldens are made from the model as mlx-lm loads it back from disk (checked equal).
    loaded, loaded_cfg = lm_utils.load_model(out_dir)
    a = dict(tree_flatten(model.parameters()))
    b = dict(tree_flatten(loaded.parameters()))
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and mx.array_equal(a[k], b[k]).item(), k
    return loaded, loaded_cfg


def check_against_convert_gguf(path, model):
    """make_goldens.convert_gguf (the SmolLM2 path) on the same file gives the same model."""
    ref_dir = WORK_DIR / (path.stem + "-convert_gguf")
    mg.convert_gguf(path, ref_dir)
    ref, _ = lm_utils.load_model(ref_dir)
    a = dict(tree_flatten(model.parameters()))
    b = dict(tree_flatten(ref.parameters()))
    assert a.keys() == b.keys(), set(a) ^ set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and mx.array_equal(a[k], b[k]).item(), k
    print("[gguf]   same weights as make_goldens.convert_gguf", flush=True)
    return ref_dir


def tokenizer_goldens(ref_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(ref_dir))
    out = []
    for s in TOKENIZER_SAMPLES:
        ids = tok.encode(s, add_special_tokens=False)
        out.append({"text": s, "ids": ids, "decoded": tok.decode(ids)})
    return out


# --------------------------------------------------------------------------------------

def sha256(p):
    return hashlib.sha256(Path(p).read_bytes()).hexdigest()


def make(name):
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUT_DIR / f"{name}.gguf"
    weights, src_cfg, types = write_gguf(name, path)
    print(f"[gguf] wrote {path.relative_to(HERE.parent)} ({path.stat().st_size} bytes)", flush=True)
    check_dequantized(name, path, weights, src_cfg, types)
    model, config = convert(path, WORK_DIR / name)
    tokenizer = None
    if GGUF_FILES[name][4]:
        ref_dir = check_against_convert_gguf(path, model)
        tokenizer = tokenizer_goldens(ref_dir)

    rng = random.Random(f"weft-gguf-goldens/{name}")
    singles = []
    for n in PROMPT_LENS:
        prompt = [rng.randrange(config["vocab_size"]) for _ in range(n)]
        res, _ = mg.single_greedy(model, prompt, SINGLE_MAX_TOKENS)
        singles.append(res)

    type_counts = {}
    for t in types.values():
        type_counts[t] = type_counts.get(t, 0) + 1
    doc = {
        "model": name,
        "gguf": f"goldens/gguf/{name}.gguf",
        "gguf_bytes": path.stat().st_size,
        "gguf_sha256": sha256(path),
        "source_model_dir": f"goldens/models/{GGUF_FILES[name][0]}",
        "mlx_version": mx.__version__,
        "mlx_lm_version": mlx_lm.__version__,
        "gguf_py_version": _gguf_version(),
        "qk_permuted": bool(permute_heads(GGUF_FILES[name][1], src_cfg)),
        "tensor_types": type_counts,
        "gguf_tensor_types": dict(sorted(types.items())),
        "config": mg.config_summary(config),
        "note_single": (
            "mlx-lm model converted from the GGUF (see make_gguf_goldens.py). generate_step("
            "prompt, model, max_tokens=24, sampler=greedy_sampler, prefill_step_size=2048), EOS "
            "ignored. first_logits = model output row (last position) of the forward that "
            "produced tokens[0]; first_logprobs = first_logits - logsumexp; margins[i] = top1 - "
            "top2 of the step-i logprobs; all float32."
        ),
        "single": singles,
    }
    if tokenizer is not None:
        doc["note_tokenizer"] = (
            "tiny byte-level BPE in the GGUF metadata (gpt2 / pre smollm, bos 1, eos 2); ids = "
            "the transformers tokenizer make_goldens.convert_gguf builds from it, "
            "encode(text, add_special_tokens=False); decoded = decode(ids)."
        )
        doc["tokenizer"] = tokenizer
    mg.write_json(OUT_DIR / f"{name}.json", doc)
    print(f"[gguf] wrote goldens/gguf/{name}.json", flush=True)


def _gguf_version():
    from importlib.metadata import version
    return version("gguf")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", action="append", default=[],
                    help="GGUF name (repeatable): " + ", ".join(GGUF_FILES))
    args = ap.parse_args()
    names = args.only or list(GGUF_FILES)
    for n in names:
        if n not in GGUF_FILES:
            ap.error(f"unknown GGUF golden {n}")
    mx.set_default_device(mx.cpu)
    # self-check: make_goldens.unpermute_rows inverts llama.cpp's permute
    t = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(24, 5)
    assert np.array_equal(np.array(mg.unpermute_rows(mx.array(permute(t, 3)), 3)), t)
    for name in names:
        print(f"[gguf] {name}", flush=True)
        make(name)


if __name__ == "__main__":
    main()
