#!/usr/bin/env python3
"""Sampling parity goldens (logits processors and sampling filters) from the pinned mlx-lm.

Usage (from the repo root):
    .venv/bin/python goldens/make_sampling_goldens.py

Writes (deterministically: re-running rewrites byte-identical files)
    goldens/sampling/processors.json  greedy trajectories of the tiny llama models through
                                      mlx_lm.generate.generate_step with
                                      logits_processors=make_logits_processors(...)
    goldens/sampling/filters.json     which entries of fixed float32 logprob vectors mlx-lm's
                                      sampler chain (apply_top_p -> apply_min_p -> apply_top_k,
                                      the order make_sampler builds) sets to -inf

Every float parameter handed to mlx-lm is first rounded to float32 (the type Weft's
SamplingParams uses), so the JSON decimal parses to exactly the value both sides used.
See goldens/README.md ("Sampling goldens") for the schema.
"""

import json
import math
import random
from pathlib import Path

import numpy as np

import mlx.core as mx

import mlx_lm
import mlx_lm.utils as lm_utils
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.sample_utils import greedy_sampler, make_logits_processors, make_sampler

HERE = Path(__file__).resolve().parent
OUT_DIR = HERE / "sampling"
MAX_TOKENS = 24
MODELS = ["llama-fp32", "llama-bf16"]


def f32(x):
    """The float32 value of x, as a Python float (exact in JSON)."""
    return float(np.float32(x))


# --------------------------------------------------------------------------------------
# Logits processors: greedy trajectories
# --------------------------------------------------------------------------------------

def trajectory(model, prompt_ids, params, prefill_step_size=2048):
    """generate_step greedy tokens (EOS ignored) with mlx-lm's processors for `params`."""
    ctx = params["context_size"]
    bias = {int(i): b for i, b in params["logit_bias"]} or None
    procs = make_logits_processors(
        logit_bias=bias,
        repetition_penalty=params["repetition_penalty"],
        repetition_context_size=ctx,
        presence_penalty=params["presence_penalty"],
        presence_context_size=ctx,
        frequency_penalty=params["frequency_penalty"],
        frequency_context_size=ctx,
    )
    tokens, margins = [], []
    for tok, logprobs in generate_step(
        mx.array(prompt_ids, dtype=mx.uint32), model, max_tokens=MAX_TOKENS,
        sampler=greedy_sampler, logits_processors=procs, prompt_cache=make_prompt_cache(model),
        prefill_step_size=prefill_step_size,
    ):
        tokens.append(int(tok))
        v = np.array(logprobs.astype(mx.float32)).astype(np.float64)
        i = int(np.argmax(v))
        assert i == tokens[-1]
        margins.append(float(np.float32(v[i] - np.max(np.delete(v, i)))))
    return tokens, margins


def params_of(logit_bias=(), repetition_penalty=None, presence_penalty=None,
              frequency_penalty=None, context_size=20):
    opt = lambda x: None if x is None else f32(x)
    return {
        "logit_bias": [[int(i), f32(b)] for i, b in logit_bias],
        "repetition_penalty": opt(repetition_penalty),
        "presence_penalty": opt(presence_penalty),
        "frequency_penalty": opt(frequency_penalty),
        "context_size": context_size,
    }


def processor_cases(model_name, model, vocab):
    rng = random.Random(f"weft-sampling/{model_name}")
    random_prompt = [rng.randrange(vocab) for _ in range(17)]
    # Few distinct ids, many repeats: the penalties (frequency especially) see duplicates.
    pool = [rng.randrange(vocab) for _ in range(4)]
    repeat_prompt = [pool[rng.randrange(4)] for _ in range(12)]
    long_prompt = [rng.randrange(vocab) for _ in range(40)]
    prompts = {"random17": random_prompt, "repeat12": repeat_prompt}

    greedy = {k: trajectory(model, p, params_of())[0] for k, p in prompts.items()}
    # Bias targets drawn from the plain greedy trajectories, so the biases bite.
    g = greedy["random17"]
    distinct = list(dict.fromkeys(g))
    absent = next(t for t in range(7, vocab, 37) if t not in g and t not in greedy["repeat12"])
    specs = [
        ("none", params_of()),
        ("bias_force", params_of(logit_bias=[(absent, 100.0)])),
        ("bias_ban", params_of(logit_bias=[(distinct[0], -1e9)] + [(t, -1e9) for t in distinct[1:3]])),
        ("bias_negative", params_of(logit_bias=[(g[5], -0.5), (g[12], -2.0), (distinct[-1], -1.5)])),
        ("bias_mixed", params_of(logit_bias=[(absent, 2.5), (g[8], -2.0), (g[15], 0.75)])),
        ("rep1.3_ctx20", params_of(repetition_penalty=1.3, context_size=20)),
        ("rep1.3_ctx5", params_of(repetition_penalty=1.3, context_size=5)),
        ("rep0.8_ctx20", params_of(repetition_penalty=0.8, context_size=20)),
        ("rep0.8_ctx5", params_of(repetition_penalty=0.8, context_size=5)),
        ("presence0.7_ctx20", params_of(presence_penalty=0.7, context_size=20)),
        ("presence1.5_ctx5", params_of(presence_penalty=1.5, context_size=5)),
        ("presence-0.5_ctx20", params_of(presence_penalty=-0.5, context_size=20)),
        ("frequency0.5_ctx20", params_of(frequency_penalty=0.5, context_size=20)),
        ("frequency0.9_ctx5", params_of(frequency_penalty=0.9, context_size=5)),
        ("combo_ctx12", params_of(logit_bias=[(absent, 1.5), (distinct[0], -1.0)],
                                  repetition_penalty=1.2, presence_penalty=0.4,
                                  frequency_penalty=0.3, context_size=12)),
        ("force_with_rep", params_of(logit_bias=[(absent, 100.0)], repetition_penalty=1.3,
                                     frequency_penalty=0.2, context_size=20)),
    ]
    cases = []
    for case_name, params in specs:
        for pname, prompt in prompts.items():
            tokens, margins = trajectory(model, prompt, params)
            cases.append({
                "name": f"{case_name}/{pname}", "prompt_ids": prompt, "prefill_step_size": 2048,
                "params": params, "tokens": tokens, "min_margin": min(margins),
                "differs_from_greedy": tokens != greedy[pname],
            })
    # Chunked prefill: the processors must still see every prompt token.
    params = specs[-2][1]
    tokens, margins = trajectory(model, long_prompt, params, prefill_step_size=8)
    ref, _ = trajectory(model, long_prompt, params_of())
    cases.append({
        "name": "combo_ctx12/long40_chunked8", "prompt_ids": long_prompt, "prefill_step_size": 8,
        "params": params, "tokens": tokens, "min_margin": min(margins),
        "differs_from_greedy": tokens != ref,
    })
    assert all(c["tokens"] == [absent] * MAX_TOKENS for c in cases if c["name"].startswith("bias_force"))
    return cases


def goldens_processors():
    models = []
    for name in MODELS:
        print(f"[sampling] processors {name}", flush=True)
        model, config = lm_utils.load_model(HERE / "models" / name)
        cases = processor_cases(name, model, config["vocab_size"])
        n_diff = sum(c["differs_from_greedy"] for c in cases if not c["name"].startswith("none/"))
        print(f"[sampling]   {len(cases)} cases, {n_diff} differ from plain greedy", flush=True)
        assert n_diff >= 0.75 * len(cases), f"{name}: only {n_diff} cases differ from plain greedy"
        models.append({"model": name, "model_dir": f"goldens/models/{name}",
                       "dtype": config.get("torch_dtype"), "cases": cases})
    return {
        "mlx_version": mx.__version__,
        "mlx_lm_version": mlx_lm.__version__,
        "note": (
            "tokens = generate_step(mx.array(prompt_ids, uint32), model, max_tokens=24, "
            "sampler=greedy_sampler, prefill_step_size=P, logits_processors="
            "make_logits_processors(logit_bias=dict(logit_bias) or None, repetition_penalty=r, "
            "repetition_context_size=C, presence_penalty=p, presence_context_size=C, "
            "frequency_penalty=f, frequency_context_size=C)) with C = context_size; EOS ignored. "
            "The processors see prompt + generated tokens (the last C of them). All floats are "
            "float32 values. min_margin = smallest top1 - top2 gap of the processed logprobs over "
            "the 24 steps. differs_from_greedy: tokens != the same prompt with no processors."
        ),
        "models": models,
    }


# --------------------------------------------------------------------------------------
# Sampling filters
# --------------------------------------------------------------------------------------

def sampler_methods(top_p, min_p, top_k):
    """The filter chain make_sampler builds (read from its closure, so it is mlx-lm's own)."""
    s = make_sampler(temp=1.0, top_p=top_p, min_p=min_p, top_k=top_k)
    cells = dict(zip(s.__code__.co_freevars, (c.cell_contents for c in s.__closure__)))
    return cells["sampling_methods"]


def logprob_vectors():
    rs = np.random.RandomState(20240611)
    V = 1000
    vecs = {}
    vecs["normal_s2"] = rs.randn(V) * 2
    vecs["normal_s05"] = rs.randn(V) * 0.5
    x = rs.randn(V) * 2
    x[137] += 25
    x[842] += 22
    vecs["peaked"] = x
    vecs["flat"] = np.zeros(V)
    vecs["ties_int"] = np.round(rs.randn(V) * 2)
    vecs["two_level"] = np.where(rs.rand(V) < 0.5, 0.0, -4.0)
    vecs["bf16"] = rs.randn(V) * 3  # logprobs computed in bfloat16, then widened
    x = rs.randn(V) * 2
    x[rs.permutation(V)[:300]] = -np.inf
    vecs["masked"] = x
    out = {}
    for name, logits in vecs.items():
        dtype = mx.bfloat16 if name == "bf16" else mx.float32
        a = mx.array(logits.astype(np.float32)).astype(dtype)[None]
        lp = (a - mx.logsumexp(a, axis=-1, keepdims=True)).astype(mx.float32)
        out[name] = np.array(lp[0]).astype(np.float32)
    return out


def knife_edge(lp, top_p, min_p):
    """Whether the kept set would flip under a relative perturbation of 1e-5 (such cases are
    left out: an implementation that rounds differently, f32 exp / sum order, could differ)."""
    if 0 < top_p < 1:
        s = np.sort(lp.astype(np.float64))
        p = np.exp(s)
        above = np.concatenate([np.cumsum(p[::-1])[::-1][1:], [0.0]])
        total = p.sum()
        lo = int(np.sum(above >= top_p * total * (1 - 1e-5)))
        hi = int(np.sum(above >= top_p * total * (1 + 1e-5)))
        if s[min(lo, len(s) - 1)] != s[min(hi, len(s) - 1)]:
            return True
    if min_p > 0:
        finite = lp[np.isfinite(lp)]
        # apply_min_p's cut: max + float32(math.log(min_p)), a float32 add. Entries exactly at
        # it (the max itself when min_p = 1) are kept by both sides.
        cut = np.float32(finite.max()) + np.float32(math.log(min_p))
        near = (np.abs(finite.astype(np.float64) - float(cut)) < 1e-5 * max(1.0, abs(float(cut))))
        near &= finite != cut
        if near.any():
            return True
    return False


FILTER_PARAMS = (
    [dict(top_p=p) for p in (0.1, 0.5, 0.8, 0.9, 0.95, 0.99)]
    + [dict(min_p=p) for p in (0.02, 0.05, 0.1, 0.3, 1.0)]
    + [dict(top_k=k) for k in (1, 10, 100, 999)]
    + [dict(top_p=0.9, min_p=0.05), dict(top_p=0.95, top_k=40), dict(min_p=0.1, top_k=5),
       dict(top_p=0.8, min_p=0.02, top_k=20)]
)


def goldens_filters():
    print("[sampling] filters", flush=True)
    vectors = logprob_vectors()
    cases, skipped = [], []
    for vname, lp in vectors.items():
        V = len(lp)
        for fp in FILTER_PARAMS:
            top_p = f32(fp.get("top_p", 1.0))
            min_p = f32(fp.get("min_p", 0.0))
            top_k = int(fp.get("top_k", 0))
            if knife_edge(lp, top_p, min_p):
                skipped.append({"vector": vname, "top_p": top_p, "min_p": min_p, "top_k": top_k})
                continue
            methods = sampler_methods(top_p, min_p, top_k)
            x = mx.array(lp)[None]
            before_top_k = None
            for i, m in enumerate(methods):
                if top_k and i == len(methods) - 1:
                    before_top_k = np.array(x[0])
                x = m(x)
            y = np.array(x[0])
            kept_mask = np.isfinite(y)
            # Filters only mask: a kept entry keeps its value.
            assert np.array_equal(y[kept_mask], lp[kept_mask])
            kept = [int(i) for i in np.nonzero(kept_mask)[0]]
            case = {"vector": vname, "top_p": top_p, "min_p": min_p, "top_k": top_k,
                    "kept_count": len(kept)}
            tie = False
            if top_k:
                fin = np.sort(before_top_k[np.isfinite(before_top_k)])[::-1]
                tie = bool(len(fin) > top_k and fin[top_k - 1] == fin[top_k])
            case["top_k_boundary_tie"] = tie
            if len(kept) <= V // 2:
                case["kept"] = kept
            else:
                case["dropped"] = [int(i) for i in np.nonzero(~kept_mask)[0]]
            cases.append(case)
    return {
        "mlx_version": mx.__version__,
        "mlx_lm_version": mlx_lm.__version__,
        "note": (
            "vectors[name] = float32 logprobs (logits - logsumexp; 'bf16' computed in bfloat16 "
            "then widened; null = -inf). For each case the chain make_sampler(temp=1, top_p, "
            "min_p, top_k) builds (apply_top_p if 0<top_p<1, apply_min_p if min_p != 0, "
            "apply_top_k if top_k > 0, in that order) was applied to the row; kept = entries "
            "still finite (listed as 'kept' when at most half the vocabulary survives, else the "
            "complement as 'dropped'). top_k_boundary_tie: the k-th and (k+1)-th largest finite "
            "inputs of apply_top_k are equal, so which tied entries survive is argpartition's "
            "choice (only kept_count is meaningful then). skipped_knife_edge: parameter sets "
            "left out because a 1e-5 relative change of the top_p mass or min_p cut would change "
            "the kept set."
        ),
        "vectors": {k: [None if not np.isfinite(v) else float(v) for v in lp.tolist()]
                    for k, lp in vectors.items()},
        "cases": cases,
        "skipped_knife_edge": skipped,
    }


# --------------------------------------------------------------------------------------
# JSON writing (as goldens/make_goldens.py: numeric lists on one line, floats repr-exact)
# --------------------------------------------------------------------------------------

def _is_scalar_list(v):
    return isinstance(v, list) and all(
        isinstance(x, (int, float, bool, str)) or x is None for x in v)


def dumps(obj, indent=0):
    pad, pad1 = "  " * indent, "  " * (indent + 1)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f"{pad1}{json.dumps(k)}: {dumps(v, indent + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list):
        if _is_scalar_list(obj) or (obj and all(_is_scalar_list(x) and len(x) <= 4 for x in obj)):
            return json.dumps(obj, separators=(", ", ": "), allow_nan=False)
        if not obj:
            return "[]"
        return "[\n" + ",\n".join(pad1 + dumps(x, indent + 1) for x in obj) + "\n" + pad + "]"
    return json.dumps(obj, allow_nan=False)


def write_json(path, doc):
    text = dumps(doc) + "\n"
    assert json.loads(text) == doc  # floats survive exactly
    path.write_text(text, encoding="utf-8")
    print(f"[sampling] wrote {path.relative_to(HERE.parent)}", flush=True)


def main():
    mx.set_default_device(mx.cpu)
    OUT_DIR.mkdir(exist_ok=True)
    write_json(OUT_DIR / "filters.json", goldens_filters())
    write_json(OUT_DIR / "processors.json", goldens_processors())


if __name__ == "__main__":
    main()
