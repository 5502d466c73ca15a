#!/usr/bin/env python3
"""Single-sequence decode speed: Weft (`weft bench --json`) vs mlx-lm (`generate_step`).

Both sides run the same weights, the same prompt (random ids from a fixed seed), the same number
of generated tokens (EOS ignored) and the same number of measured runs after one warm-up, in the
same invocation of this script, so they see the same machine load as far as possible.

Measured per run, on both sides the same way:
  ttft_ms       start of generation (cache creation, prefill of prompt[:-1], the last prompt
                token's forward) until the first token id is on the host
  decode_tok_s  (n - 1) / (time from the first token to the last), n = --gen
  prefill_tok_s prompt_len / ttft
Reported: the median of the runs (with --rounds > 1, the median of the per-round medians).

The prompt is the one `weft bench --seed S` builds (the same xorshift64 stream, ids modulo the
vocabulary size from config.json), so both engines see identical token ids.

Models: a directory (mlx-lm / Hugging Face layout) is used by both. mlx-lm cannot load GGUF, so
for a .gguf file mlx-lm runs the equivalent converted directory: --mlx-model DIR, or for the
default model (SmolLM2-135M-Instruct.Q4_1.gguf) goldens/.work/smollm2, which
`goldens/make_goldens.py --only smollm2` writes.

Run with the repository's oracle venv: .venv/bin/python benches/compare_mlx_lm.py --help
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
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_GGUF_CONVERTED = REPO / "goldens" / ".work" / "smollm2"
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


def resolve_mlx_model(model: Path, mlx_model: Path | None) -> Path:
    if mlx_model is not None:
        return mlx_model
    if model.is_dir():
        return model
    if model.suffix.lower() == ".gguf":
        if model.name == DEFAULT_GGUF_NAME:
            if (DEFAULT_GGUF_CONVERTED / "config.json").exists():
                return DEFAULT_GGUF_CONVERTED
            sys.exit(
                f"error: mlx-lm cannot load GGUF; {DEFAULT_GGUF_CONVERTED} (the converted default "
                "model) is missing: run `.venv/bin/python goldens/make_goldens.py --only smollm2` "
                "or pass --mlx-model DIR"
            )
        sys.exit(f"error: mlx-lm cannot load GGUF; pass --mlx-model DIR (an mlx-lm conversion of {model})")
    sys.exit(f"error: {model} is neither a model directory nor a .gguf file")


def median(xs: list[float]) -> float:
    return statistics.median(xs)


# ---------------------------------------------------------------------------------------------
# Weft


def run_weft(binary: Path, model: Path, prompt_len: int, gen: int, runs: int, seed: int) -> dict:
    cmd = [
        str(binary), "bench", "--json", "--model", str(model),
        "--prompt-len", str(prompt_len), "--gen", str(gen), "--runs", str(runs), "--seed", str(seed),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} exited with {proc.returncode}:\n{proc.stderr.strip()}")
    try:
        results = json.loads(proc.stdout)["results"]
        row = next(r for r in results if r.get("batch", 1) == 1)
    except (ValueError, KeyError, StopIteration) as e:
        sys.exit(f"error: unexpected `weft bench --json` output ({e}):\n{proc.stdout}")
    return {
        "decode_tok_s": float(row["decode_tok_s"]),
        "ttft_ms": float(row["ttft_ms"]),
        "prefill_tok_s": float(row["prefill_tok_s"]),
        "command": cmd,
    }


# ---------------------------------------------------------------------------------------------
# mlx-lm


def load_mlx_lm(path: Path):
    from mlx_lm.utils import load_model

    model, config = load_model(path)  # no tokenizer needed: the tiny models have none
    return model, config


def mlx_lm_run(model, prompt: list[int], gen: int) -> dict:
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    tokens = mx.array(prompt)
    mx.synchronize()
    t0 = time.perf_counter()
    t_first = t_last = None
    n = 0
    # generate_step: greedy by default, prompt[:-1] prefilled, pipelined decode; it never stops
    # at EOS by itself (stream_generate does that), so exactly `gen` tokens come out.
    for _token, _logprobs in generate_step(tokens, model, max_tokens=gen):
        t_last = time.perf_counter()
        if n == 0:
            t_first = t_last
        n += 1
    # generate_step has one step in flight when it returns; finish it outside the timing.
    mx.synchronize()
    ttft = t_first - t0
    decode = (n - 1) / (t_last - t_first) if n > 1 and t_last > t_first else 0.0
    return {"decode_tok_s": decode, "ttft_ms": ttft * 1000.0, "prefill_tok_s": len(prompt) / ttft, "tokens": n}


def run_mlx_lm(model, prompt: list[int], gen: int, runs: int) -> dict:
    mlx_lm_run(model, prompt, min(gen, 4))  # warm-up, as `weft bench` does (4 tokens)
    per_run = [mlx_lm_run(model, prompt, gen) for _ in range(runs)]
    return {
        "decode_tok_s": median([r["decode_tok_s"] for r in per_run]),
        "ttft_ms": median([r["ttft_ms"] for r in per_run]),
        "prefill_tok_s": median([r["prefill_tok_s"] for r in per_run]),
        "runs": per_run,
    }


# ---------------------------------------------------------------------------------------------


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {"nproc": os.cpu_count(), "cpu": cpu, "platform": platform.platform()}
    try:
        info["loadavg_1m_at_end"] = os.getloadavg()[0]
    except OSError:
        pass
    return info


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        return out.stdout.strip() or None
    except OSError:
        return None


def main() -> None:
    ap = argparse.ArgumentParser(
        description="Compare Weft's single-sequence decode speed with mlx-lm's on the same model.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument("model", type=Path, help="model directory or .gguf file (what Weft runs)")
    ap.add_argument("--mlx-model", type=Path, default=None,
                    help="directory mlx-lm runs (default: MODEL if a directory; for the default-model "
                         "GGUF, goldens/.work/smollm2)")
    ap.add_argument("--weft", type=Path, default=REPO / "target" / "release" / "weft", help="the weft binary")
    ap.add_argument("--prompt-len", type=int, default=32, help="prompt length in tokens (random ids)")
    ap.add_argument("--gen", type=int, default=128, help="tokens generated per run (EOS ignored)")
    ap.add_argument("--runs", type=int, default=5, help="measured runs per engine per round (>= 3)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat weft/mlx-lm alternately this many times (order flips each round) and "
                         "report the median of the per-round medians; helps on a noisy machine")
    ap.add_argument("--seed", type=int, default=0, help="seed of the prompt ids (as `weft bench --seed`)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = ap.parse_args()

    if args.runs < 3:
        ap.error("--runs must be at least 3 (medians of fewer runs are not worth reporting)")
    if args.gen < 2:
        ap.error("--gen must be at least 2 (decode speed needs two tokens)")
    if args.prompt_len < 1 or args.rounds < 1:
        ap.error("--prompt-len and --rounds must be at least 1")
    if not args.weft.exists():
        sys.exit(f"error: {args.weft} not found; build it with `cargo build --release -p weft-cli`")
    if not args.model.exists():
        sys.exit(f"error: {args.model} does not exist")
    mlx_path = resolve_mlx_model(args.model, args.mlx_model)

    import mlx.core as mx
    import mlx_lm

    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    load_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    model, config = load_mlx_lm(mlx_path)
    # Multimodal-form configs (qwen3_5, gemma3) keep the text model's sizes in text_config.
    vocab = int(config.get("vocab_size") or config["text_config"]["vocab_size"])
    prompt = prompt_ids(args.seed, args.prompt_len, vocab)

    weft_rounds, mlx_rounds = [], []
    for r in range(args.rounds):
        order = ("weft", "mlx") if r % 2 == 0 else ("mlx", "weft")
        for who in order:
            if who == "weft":
                weft_rounds.append(run_weft(args.weft, args.model, args.prompt_len, args.gen, args.runs, args.seed))
            else:
                mlx_rounds.append(run_mlx_lm(model, prompt, args.gen, args.runs))

    def summary(rounds: list[dict]) -> dict:
        keys = ("decode_tok_s", "ttft_ms", "prefill_tok_s")
        return {k: median([x[k] for x in rounds]) for k in keys}

    weft, mlx = summary(weft_rounds), summary(mlx_rounds)
    ratio = {k: (weft[k] / mlx[k] if mlx[k] else None) for k in weft}
    result = {
        "model": str(args.model),
        "mlx_model": str(mlx_path),
        "prompt_len": args.prompt_len,
        "gen": args.gen,
        "runs": args.runs,
        "rounds": args.rounds,
        "seed": args.seed,
        "vocab_size": vocab,
        "weft": {**weft, "rounds": weft_rounds},
        "mlx_lm": {**mlx, "rounds": mlx_rounds},
        "ratio_weft_over_mlx_lm": ratio,
        "versions": {"mlx": mx.__version__, "mlx_lm": mlx_lm.__version__},
        "weft_binary": str(args.weft),
        "git_commit": git_commit(),
        "machine": {**machine(), "loadavg_1m_at_start": load_start},
        "ld_preload": os.environ.get("LD_PRELOAD"),
        "started": started,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return

    print(f"weft:   {args.model}")
    print(f"mlx-lm: {mlx_path}  (mlx {mx.__version__}, mlx-lm {mlx_lm.__version__})")
    print(f"prompt {args.prompt_len} tokens, gen {args.gen}, {args.runs} runs x {args.rounds} round(s), medians")
    print(f"{'':16} {'weft':>10} {'mlx-lm':>10} {'weft/mlx-lm':>12}")
    for key, label in (("decode_tok_s", "decode tok/s"), ("ttft_ms", "TTFT ms"), ("prefill_tok_s", "prefill tok/s")):
        r = ratio[key]
        print(f"{label:16} {weft[key]:>10.1f} {mlx[key]:>10.1f} {(f'{r:.2f}' if r else '-'):>12}")
    print("(decode and prefill: higher is better; TTFT: lower is better)")


if __name__ == "__main__":
    main()
