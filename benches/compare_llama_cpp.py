#!/usr/bin/env python3
"""Weft (`weft bench --json`) vs llama.cpp (llama-cpp-python) on the same GGUF, side by side.

For each prompt length (random ids from a fixed seed, the same on both sides, EOS ignored):
  ttft_ms       start of generation until the first token is on the host (prefill included)
  decode_tok_s  (n - 1) / (time from the first token to the last), n = --gen
  ms/step       1000 / decode_tok_s
Weft also runs at each --batch size (aggregate decode tok/s of B rows submitted together).
Rounds alternate which engine goes first; reported: medians of per-round medians.

llama.cpp runs in this process (llama-cpp-python, greedy, n_threads = n_threads_batch =
--threads); run this script with the Python that has it, e.g. a venv outside the repository:

  python3 -m venv /work/llama-venv
  CMAKE_ARGS="-DLLAMA_CURL=OFF -DGGML_NATIVE=ON" /work/llama-venv/bin/pip install \\
      --no-binary llama-cpp-python llama-cpp-python==0.3.36
  /work/llama-venv/bin/python benches/compare_llama_cpp.py

Weft runs as a subprocess (`--weft`, default target/release/weft) with WEFT_CPU_THREADS =
--threads and `--cpu-kernels` = --weft-kernels (fast by default).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_GGUF = (
    Path.home() / ".cache/weft/models/smollm2-135m-instruct-q4_1/SmolLM2-135M-Instruct.Q4_1.gguf"
)
MASK64 = (1 << 64) - 1


def prompt_ids(seed: int, length: int, vocab: int) -> list[int]:
    """The prompt `weft bench --seed SEED --prompt-len LENGTH` uses (cli/src/bench.rs)."""
    state = ((seed * 0x9E3779B97F4A7C15) & MASK64) | 1
    out = []
    for _ in range(max(length, 1)):
        state ^= (state << 13) & MASK64
        state ^= state >> 7
        state ^= (state << 17) & MASK64
        out.append(state % vocab)
    return out


def run_llama(llm, prompt: list[int], gen: int) -> dict:
    llm.reset()  # no prefix reuse between runs
    start = time.perf_counter()
    first = last = None
    n = 0
    for _tok in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
        now = time.perf_counter()
        if first is None:
            first = now
        last = now
        n += 1
        if n >= gen:
            break
    return {"ttft_ms": (first - start) * 1000.0, "decode_tok_s": (n - 1) / (last - first)}


def measure_llama(llm, prompt, gen, runs) -> dict:
    run_llama(llm, prompt, 4)  # warm-up
    rs = [run_llama(llm, prompt, gen) for _ in range(runs)]
    return {k: statistics.median(r[k] for r in rs) for k in ("ttft_ms", "decode_tok_s")}


def measure_weft(args, prompt_len: int) -> dict:
    env = dict(os.environ, WEFT_CPU_THREADS=str(args.threads))
    cmd = [
        str(args.weft), "--cpu-kernels", args.weft_kernels, "bench", "-m", str(args.model),
        "--json", "--prompt-len", str(prompt_len), "--gen", str(args.gen), "--runs", str(args.runs),
        "--seed", str(args.seed), "--batch", ",".join(str(b) for b in args.batch),
    ]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    res = json.loads(out)["results"]
    return {
        r["batch"]: {"ttft_ms": r["ttft_ms"], "decode_tok_s": r["decode_tok_s"], "step_ms": r["step_ms"]}
        for r in res
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", type=Path, default=DEFAULT_GGUF, help="GGUF file (default: the default model)")
    p.add_argument("--weft", type=Path, default=REPO / "target/release/weft")
    p.add_argument("--weft-kernels", default="fast", choices=["fast", "exact"])
    p.add_argument("--prompt-len", default="32,512", help="comma-separated prompt lengths")
    p.add_argument("--gen", type=int, default=64)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch", default="1,8", help="Weft batch sizes (llama.cpp runs batch 1)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    args.batch = [int(b) for b in args.batch.split(",")]
    lens = [int(x) for x in args.prompt_len.split(",")]
    if 1 not in args.batch:
        sys.exit("--batch must include 1 (the side-by-side row)")

    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=str(args.model), n_threads=args.threads, n_threads_batch=args.threads,
        n_ctx=max(lens) + args.gen + 16, n_batch=512, verbose=False,
    )
    vocab = llm.n_vocab()
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    load_start = os.getloadavg()[0]
    rounds = {n: {"llama": [], "weft": []} for n in lens}
    for r in range(args.rounds):
        for n in lens:
            prompt = prompt_ids(args.seed, n, vocab)
            order = ["weft", "llama"] if r % 2 == 0 else ["llama", "weft"]
            for side in order:
                if side == "llama":
                    rounds[n]["llama"].append(measure_llama(llm, prompt, args.gen, args.runs))
                else:
                    rounds[n]["weft"].append(measure_weft(args, n))
    load_end = os.getloadavg()[0]

    def med(xs):
        return statistics.median(xs)

    report = {
        "started": started, "finished": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "model": str(args.model), "gen": args.gen, "runs": args.runs, "rounds": args.rounds,
        "threads": args.threads, "weft_kernels": args.weft_kernels,
        "llama_cpp_python": llama_cpp.__version__, "machine": platform.platform(),
        "nproc": os.cpu_count(), "load_avg": [load_start, load_end], "results": [],
    }
    for n in lens:
        ll = rounds[n]["llama"]
        wf = rounds[n]["weft"]
        row = {
            "prompt_len": n,
            "llama": {k: med([x[k] for x in ll]) for k in ("ttft_ms", "decode_tok_s")},
            "llama_rounds": [x["decode_tok_s"] for x in ll],
            "weft": {},
        }
        for b in args.batch:
            row["weft"][b] = {
                "ttft_ms": med([x[b]["ttft_ms"] for x in wf]),
                "decode_tok_s": med([x[b]["decode_tok_s"] for x in wf]),
                "decode_rounds": [x[b]["decode_tok_s"] for x in wf],
                "eval_wait_ms": med([x[b]["step_ms"]["eval_wait"] for x in wf]),
                "graph_build_ms": med([x[b]["step_ms"]["graph_build"] for x in wf]),
            }
        report["results"].append(row)
    if args.json:
        print(json.dumps(report, indent=1))
        return
    print(f"model {args.model}\nllama-cpp-python {llama_cpp.__version__}, threads {args.threads}, "
          f"weft --cpu-kernels {args.weft_kernels}; gen {args.gen}, {args.runs} runs x {args.rounds} rounds; "
          f"load avg {load_start:.1f} -> {load_end:.1f}")
    print(f"{'prompt':>6} {'engine':>10} {'decode tok/s':>13} {'ms/step':>8} {'TTFT ms':>9} {'decode ratio':>13} {'TTFT ratio':>11}")
    for row in report["results"]:
        ll = row["llama"]
        print(f"{row['prompt_len']:>6} {'llama.cpp':>10} {ll['decode_tok_s']:>13.1f} {1000 / ll['decode_tok_s']:>8.2f} {ll['ttft_ms']:>9.1f}")
        for b, w in row["weft"].items():
            name = "weft" if b == 1 else f"weft B={b}"
            ratio = f"{w['decode_tok_s'] / ll['decode_tok_s']:>13.3f}" if b == 1 else f"{'(agg)':>13}"
            tr = f"{w['ttft_ms'] / ll['ttft_ms']:>11.2f}" if b == 1 else ""
            print(f"{'':>6} {name:>10} {w['decode_tok_s']:>13.1f} {1000 * b / w['decode_tok_s']:>8.2f} {w['ttft_ms']:>9.1f} {ratio} {tr}")


if __name__ == "__main__":
    main()
