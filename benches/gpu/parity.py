"""Greedy tokens of Weft and mlx-lm on the same MLX build and device (run on the GPU machine
after unpack.sh; see README.md). For each model dir: rows of random prompt ids, N tokens each,
compared two ways: single (mlx-lm's generate_step vs `weft generate` with one row) and batched
(mlx-lm's batch_generate vs `weft generate` with every row in one engine batch; on a GPU the
kernels for a batch of B rows differ from B=1, so only like is compared with like). Prints one
line per model and exits 1 on any mismatch.

Usage: python3 parity.py --weft BIN [--min-len 4 --max-len 40] MODEL_DIR...
(prompts of 256 tokens or more take MLX's cuDNN decode attention on CUDA, shorter ones its vector
kernel: run both ranges.)
"""
import argparse, json, random, subprocess, sys

import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.utils import load_model


def mlx_lm_tokens(model, prompt, n):
    out = []
    for tok, _ in generate_step(mx.array(prompt), model, max_tokens=n):
        out.append(int(tok))
    return out


def mlx_lm_batch_tokens(model, prompts, n):
    """BatchGenerator (batch_generate's loop, no stop tokens): n greedy tokens per row."""
    from mlx_lm.generate import BatchGenerator

    gen = BatchGenerator(model, stop_tokens=[])
    uids = gen.insert(prompts, [n] * len(prompts))
    out = {u: [] for u in uids}
    while responses := gen.next_generated():
        for r in responses:
            out[r.uid].append(int(r.token))
    gen.close()
    return [out[u] for u in uids]


def weft_run(a, path, prompts):
    cmd = [a.weft, "generate", "-m", path, "--max-tokens", str(a.tokens), "--no-eos", "--json"]
    for p in prompts:
        cmd += ["--prompt-ids", ",".join(map(str, p))]
    return json.loads(subprocess.check_output(cmd))


def weft_tokens(a, path, prompts):
    out = weft_run(a, path, prompts)
    return [r["tokens"] for r in out.get("rows", [out])]


def first_step_gap(model, prompt, weft_logits):
    """Max |difference| of the first step's leading logits (`weft generate --json` reports the
    first few; Weft's single run vs mlx-lm's forward over the prompt), and mlx-lm's top-1 minus
    top-2 logit: a token differing where that gap is about the size of the difference is a near
    tie between kernels, not a wrong model."""
    ref = model(mx.array(prompt)[None])[0, -1].astype(mx.float32)
    got = mx.array(weft_logits, dtype=mx.float32)
    top2 = mx.sort(ref)[-2:]
    return mx.max(mx.abs(got - ref[: got.size])).item(), (top2[1] - top2[0]).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weft", required=True)
    ap.add_argument("--rows", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--min-len", type=int, default=4, help="shortest prompt (tokens)")
    ap.add_argument("--max-len", type=int, default=40, help="longest prompt (tokens, exclusive)")
    ap.add_argument("models", nargs="+")
    a = ap.parse_args()
    print(f"mlx default device: {mx.default_device()}")
    bad = 0
    for path in a.models:
        model, config = load_model(__import__("pathlib").Path(path))
        vocab = config.get("vocab_size") or config.get("text_config", {}).get("vocab_size")
        rng = random.Random(7)
        prompts = [[rng.randrange(1, vocab) for _ in range(rng.randrange(a.min_len, a.max_len))] for _ in range(a.rows)]
        single_ref = [mlx_lm_tokens(model, p, a.tokens) for p in prompts]
        runs = [weft_run(a, path, [p]) for p in prompts]
        single = [r["tokens"] for r in runs]
        gaps = [first_step_gap(model, p, r["first_logits"]) for p, r in zip(prompts, runs) if r.get("first_logits")]
        if gaps:
            print(f"{path} first step: max |dlogit| (leading) {max(g[0] for g in gaps):.3g}, "
                  f"mlx-lm top1-top2 gaps {[round(g[1], 4) for g in gaps]}")
        batch_ref = mlx_lm_batch_tokens(model, prompts, a.tokens)
        batch = weft_tokens(a, path, prompts)
        for kind, got, ref in (("single", single, single_ref), ("batched", batch, batch_ref)):
            same = sum(g == r for g, r in zip(got, ref))
            diff = [next((i for i, (x, y) in enumerate(zip(g, r)) if x != y), None) for g, r in zip(got, ref)]
            note = "" if same == len(ref) else f" (first differing step per row: {diff})"
            print(f"{path} {kind}: {same}/{len(ref)} rows equal{note}")
            bad += same != len(ref)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
