#!/usr/bin/env python3
"""Batched generation speed: `weft bench` vs mlx-lm's BatchGenerator, same model, same shapes,
same prompts, same run. Prints per-batch-size medians and Weft/mlx-lm ratios.

    .venv/bin/python benches/batch_vs_mlx_lm.py --model goldens/models/llama-fp32 --batch 1,4,8,16

For a .gguf (mlx-lm cannot read GGUF) pass --mlx-model with the converted directory
(goldens/make_goldens.py --only smollm2 writes goldens/.work/smollm2).

Metrics (both sides measured the same way): agg tok/s = generated tokens / wall time from
submission to the last token; ttft = median per-row time to first token; prefill tok/s = prompt
tokens / time until every row has its first token; decode tok/s = tokens after each row's first
/ time from the last first token to the end.
"""
import argparse
import json
import pathlib
import statistics
import subprocess
import sys

import mlx.core as mx
from mlx_lm.utils import load_model

# The prompt stream and the timed BatchGenerator run are warm_vs_mlx_lm.py's (one copy).
from warm_vs_mlx_lm import mlx_lm_once, random_prompts


def mlx_lm_bench(model_dir, batches, prompt_len, gen, runs, seed, prefill_step_size):
    model, config = load_model(pathlib.Path(model_dir))
    vocab = config["vocab_size"]
    results = []
    for b in batches:
        prompts = random_prompts(seed, b, prompt_len, vocab)
        mlx_lm_once(model, prompts, 4, prefill_step_size)  # warm-up
        samples = [mlx_lm_once(model, prompts, gen, prefill_step_size) for _ in range(runs)]
        for sample in samples:
            sample["ttft_ms"] = sample.pop("ttft_p50_ms")
        results.append({"batch": b, **{k: statistics.median(s[k] for s in samples) for k in samples[0]}})
    return results


def weft_bench(weft, model, batches, prompt_len, gen, runs, seed, prefill_step_size):
    cmd = [weft, "bench", "--model", model, "--batch", ",".join(map(str, batches)),
           "--prompt-len", str(prompt_len), "--gen", str(gen), "--runs", str(runs),
           "--seed", str(seed), "--prefill-step-size", str(prefill_step_size), "--json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)["results"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="model for weft (dir or .gguf)")
    ap.add_argument("--mlx-model", help="model dir for mlx-lm (default: --model)")
    ap.add_argument("--weft", default="target/release/weft")
    ap.add_argument("--batch", default="1,4,8,16")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prefill-step-size", type=int, default=2048)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    batches = [int(b) for b in a.batch.split(",")]
    mlx_dir = a.mlx_model or a.model
    if mlx_dir.endswith(".gguf"):
        sys.exit("mlx-lm cannot load GGUF: pass --mlx-model with the converted directory")
    ours = weft_bench(a.weft, a.model, batches, a.prompt_len, a.gen, a.runs, a.seed, a.prefill_step_size)
    theirs = mlx_lm_bench(mlx_dir, batches, a.prompt_len, a.gen, a.runs, a.seed, a.prefill_step_size)
    rows = []
    for w, m in zip(ours, theirs):
        rows.append({"batch": w["batch"], "weft": w, "mlx_lm": m,
                     "ratio": {k: w[k] / m[k] if k != "ttft_ms" else m[k] / w[k] for k in m if k != "batch"}})
    if a.json:
        print(json.dumps({"model": a.model, "mlx_model": mlx_dir, "prompt_len": a.prompt_len, "gen": a.gen,
                          "runs": a.runs, "mlx_version": mx.__version__, "rows": rows}, indent=1))
        return
    print(f"model {a.model}  prompt_len {a.prompt_len}  gen {a.gen}  medians of {a.runs} runs "
          f"(ratio = Weft / mlx-lm; for TTFT, mlx-lm / Weft: >1 means Weft is better)")
    print(f"{'B':>3} | {'agg tok/s weft':>14} {'mlx-lm':>8} {'ratio':>6} | {'decode weft':>11} {'mlx-lm':>8} {'ratio':>6} "
          f"| {'ttft ms weft':>12} {'mlx-lm':>8} {'ratio':>6}")
    for r in rows:
        w, m, q = r["weft"], r["mlx_lm"], r["ratio"]
        print(f"{r['batch']:>3} | {w['agg_tok_s']:>14.1f} {m['agg_tok_s']:>8.1f} {q['agg_tok_s']:>6.2f} | "
              f"{w['decode_tok_s']:>11.1f} {m['decode_tok_s']:>8.1f} {q['decode_tok_s']:>6.2f} | "
              f"{w['ttft_ms']:>12.1f} {m['ttft_ms']:>8.1f} {q['ttft_ms']:>6.2f}")


if __name__ == "__main__":
    main()
