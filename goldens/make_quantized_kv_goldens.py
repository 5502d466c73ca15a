#!/usr/bin/env python3
"""Weft parity goldens for the quantized KV cache (mlx-lm `QuantizedKVCache`).

Usage (from the repo root):
    .venv/bin/python goldens/make_quantized_kv_goldens.py

Writes goldens/quantized_kv.json (and the tiny model goldens/models/llama-hd64/, whose head_dim
64 allows the default kv_group_size 64; the other tiny models have head_dim 32, so they use
group size 32). Deterministic: re-running rewrites byte-identical files.

Each case is mlx-lm's own single-sequence path:
    generate_step(prompt, model, max_tokens=24, sampler=greedy_sampler, prefill_step_size=P,
                  kv_bits=B, kv_group_size=G, quantized_kv_start=S)
i.e. after every prefill chunk and every step's forward, `maybe_quantize_kv_cache` turns each
KVCache whose offset >= S into a QuantizedKVCache (`KVCache.to_quantized`), whose attention is
`models/base.py quantized_scaled_dot_product_attention`.
"""

import json
import math
import random
import sys
from pathlib import Path

import mlx.core as mx
import mlx_lm
import mlx_lm.utils as lm_utils
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import QuantizedKVCache, make_prompt_cache
from mlx_lm.sample_utils import greedy_sampler

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import make_goldens as mg  # noqa: E402

MAX_TOKENS = 24

# A llama with head_dim 64 (hidden 128, 2 heads, 1 kv head) so kv_group_size 64 applies.
HD64 = dict(
    seed=3001,
    dtype="float32",
    config=mg._base_config(
        "llama", "LlamaForCausalLM",
        hidden_size=128, num_hidden_layers=2, intermediate_size=256,
        num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-5,
        vocab_size=1024, rope_theta=10000.0, max_position_embeddings=2048,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
        torch_dtype="float32",
    ),
    scales=dict(embed=8.0, qk=3.0, lm_head=12.0),
    batch=False,
)

# (model, kv_bits, kv_group_size, quantized_kv_start)
SETTINGS = [
    ("llama-fp32", 8, 32, 0),
    ("llama-fp32", 4, 32, 0),
    ("llama-fp32", 4, 32, 20),
    ("qwen3", 8, 32, 0),
    ("qwen3", 4, 32, 0),
    ("qwen3", 4, 32, 20),
    ("llama-hd64", 4, 64, 0),
    ("llama-hd64", 8, 64, 0),
    ("llama-bf16", 4, 32, 0),
]


class _CacheKindRecorder(mg._Recorder):
    """Also records, per forward, whether the cache it ran on was already quantized."""

    def __init__(self, model):
        super().__init__(model)
        self.quantized = []

    def __call__(self, *args, **kwargs):
        self.quantized.append(isinstance(kwargs["cache"][0], QuantizedKVCache))
        return super().__call__(*args, **kwargs)


def greedy_quantized(model, prompt_ids, prefill_step_size, bits, group, start):
    rec = _CacheKindRecorder(model)
    cache = make_prompt_cache(model)
    L = len(prompt_ids)
    n_prefill = 0 if L <= 1 else math.ceil((L - 1) / prefill_step_size)
    tokens, margins = [], []
    first_logprobs = None
    for n, (tok, logprobs) in enumerate(generate_step(
        mx.array(prompt_ids, dtype=mx.uint32), rec, max_tokens=MAX_TOKENS,
        sampler=greedy_sampler, prompt_cache=cache, prefill_step_size=prefill_step_size,
        kv_bits=bits, kv_group_size=group, quantized_kv_start=start,
    )):
        if n == 0:
            first_logprobs = logprobs
        tokens.append(int(tok))
        margins.append(mg.top2_margin(logprobs))
    assert all(isinstance(c, QuantizedKVCache) for c in cache), "every layer ends quantized"
    first_logits = rec.outputs[n_prefill][0, -1, :]
    assert int(mx.argmax(first_logprobs).item()) == tokens[0]
    return {
        "prompt_ids": list(prompt_ids),
        "prefill_step_size": prefill_step_size,
        "tokens": tokens,
        "margins": margins,
        "first_logits": mg.f32_list(first_logits),
        # which forwards ran on a quantized cache (prefill chunks, then one per token)
        "quantized_forwards": rec.quantized,
    }


def quantized_forward_flags(L, prefill_step_size, start):
    """Forward i runs quantized iff an earlier forward left the cache at offset >= start."""
    sizes = []
    rest = L - 1
    while rest > 0:
        n = min(prefill_step_size, rest)
        sizes.append(n)
        rest -= n
    sizes += [1] * MAX_TOKENS  # last prompt token, then one per generated token (the last is
    sizes = sizes[:-1]         # never forwarded)
    flags, offset, quantized = [], 0, False
    for n in sizes:
        flags.append(quantized)
        offset += n
        quantized = quantized or offset >= start
    return flags


def main():
    mx.set_default_device(mx.cpu)
    mg.TINY_MODELS["llama-hd64"] = HD64
    models = {}
    cases = []
    for name, bits, group, start in SETTINGS:
        if name not in models:
            if name == "llama-hd64":
                models[name] = mg.build_tiny(name)
            else:
                models[name] = lm_utils.load_model(mg.MODELS_DIR / name)
        model, config = models[name]
        rng = random.Random(f"weft-quantized-kv/{name}")
        vocab = config["vocab_size"]
        prompts = {n: [rng.randrange(vocab) for _ in range(n)] for n in (1, 5, 17, 40)}
        runs = []
        for L, step in ((1, 2048), (5, 2048), (17, 2048), (40, 2048), (40, 16)):
            r = greedy_quantized(model, prompts[L], step, bits, group, start)
            # generate_step builds one forward beyond the last token (pipelining); drop it.
            r["quantized_forwards"] = r["quantized_forwards"][:len(quantized_forward_flags(L, step, start))]
            assert r["quantized_forwards"] == quantized_forward_flags(L, step, start)
            full, _ = mg.single_greedy(model, prompts[L], MAX_TOKENS, prefill_step_size=step)
            r["full_precision_tokens"] = full["tokens"]
            runs.append(r)
        cases.append({"model": name, "model_dir": f"goldens/models/{name}", "kv_bits": bits,
                      "kv_group_size": group, "quantized_kv_start": start, "single": runs})
        print(f"[quantized kv] {name} bits={bits} group={group} start={start}: "
              + ", ".join(f"{len(r['prompt_ids'])}/{r['prefill_step_size']} "
                          f"{'=' if r['tokens'] == r['full_precision_tokens'] else 'differs'}"
                          for r in runs), flush=True)
    doc = {
        "mlx_version": mx.__version__,
        "mlx_lm_version": mlx_lm.__version__,
        "note": (
            "generate_step(prompt, model, max_tokens=24, sampler=greedy_sampler, prefill_step_size=P, "
            "kv_bits, kv_group_size, quantized_kv_start): greedy, EOS ignored. first_logits = the output "
            "row of the forward that produced tokens[0] (float32). quantized_forwards[i] says whether "
            "forward i (prefill chunks, then the last prompt token, then one per generated token but the "
            "last) ran with QuantizedKVCache (the conversion happens after a forward leaves offset >= "
            "quantized_kv_start). full_precision_tokens = the same run without KV quantization."
        ),
        "cases": cases,
    }
    mg.write_json(HERE / "quantized_kv.json", doc)
    print("[quantized kv] wrote goldens/quantized_kv.json")


if __name__ == "__main__":
    main()
