#!/usr/bin/env python3
"""Next-token distributions of Weft's CPU modes and llama.cpp against Weft's exact mode, on the
same GGUF and the same token sequences (real text through the GGUF's tokenizer), teacher-forced
one token a step (decode: the fast kernel's int8 activations apply below 16 rows).

For X in {float (fast mode, float activations), int8 (fast mode, int8 activations), llama.cpp
(token by token, and the whole sequence as one batch)}: KL(exact || X) per position in nats
(mean, median, p95, max) and top-1 agreement with exact; also KL(llama.cpp || int8) and
KL(llama.cpp || float).

Weft's logits come from `token_logits` (benches/token_logits.rs: build it with
`cargo build --release -p weft-core --example token_logits`), llama.cpp's from
llama-cpp-python in this process (logits_all=True, n_threads = --threads); run with the Python
that has it (see compare_llama_cpp.py):

  /work/llama-venv/bin/python benches/int8_kl.py [--positions 256] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
DEFAULT_GGUF = (
    Path.home() / ".cache/weft/models/smollm2-135m-instruct-q4_1/SmolLM2-135M-Instruct.Q4_1.gguf"
)
# Prose, reference prose, code, and a chat-templated exchange (the goldens' longest answer).
SOURCES = ["README.md", "docs/models.md", "core/src/prefill.rs", "goldens/smollm2.json"]


def texts() -> list[str]:
    out = [(REPO / p).read_text()[:4000] for p in SOURCES[:3]]
    chat = max(json.loads((REPO / SOURCES[3]).read_text())["chats"], key=lambda c: len(c["tokens"]))
    out.append(chat["prompt_text"] + chat["text"])
    return out


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def kl(lp: np.ndarray, lq: np.ndarray) -> np.ndarray:
    """KL(p || q) per row, from log-probabilities."""
    return (np.exp(lp) * (lp - lq)).sum(axis=-1)


def weft_logits(args, ids_file: Path, kernels: str, act: str, n: int, vocab: int) -> np.ndarray:
    with tempfile.NamedTemporaryFile(suffix=".f32") as out:
        env = dict(os.environ, WEFT_CPU_THREADS=str(args.threads))
        cmd = [str(args.token_logits), str(args.model), str(ids_file), out.name,
               "--cpu-kernels", kernels, "--cpu-activations", act]
        subprocess.run(cmd, env=env, check=True)
        return np.fromfile(out.name, dtype="<f4").reshape(n, vocab)


def llama_logits(llm, seqs: list[list[int]], batched: bool) -> np.ndarray:
    rows = []
    for s in seqs:
        llm.reset()
        if batched:
            llm.eval(s)
        else:
            for t in s:
                llm.eval([t])
        rows.append(np.array(llm.scores[: len(s)], dtype=np.float32))
    return np.concatenate(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", type=Path, default=DEFAULT_GGUF)
    p.add_argument("--token-logits", type=Path, default=REPO / "target/release/examples/token_logits")
    p.add_argument("--positions", type=int, default=256, help="tokens per sequence")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()

    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=str(args.model), n_threads=args.threads, n_threads_batch=args.threads,
        n_ctx=args.positions + 16, n_batch=512, logits_all=True, verbose=False,
    )
    vocab = llm.n_vocab()
    seqs = [llm.tokenize(t.encode(), add_bos=False, special=True)[: args.positions] for t in texts()]
    n = sum(len(s) for s in seqs)
    with tempfile.NamedTemporaryFile("w", suffix=".ids", delete=False) as f:
        f.write("".join(" ".join(map(str, s)) + "\n" for s in seqs))
        ids_file = Path(f.name)
    try:
        lp = {
            "exact": log_softmax(weft_logits(args, ids_file, "exact", "float", n, vocab)),
            "float": log_softmax(weft_logits(args, ids_file, "fast", "float", n, vocab)),
            "int8": log_softmax(weft_logits(args, ids_file, "fast", "int8", n, vocab)),
        }
    finally:
        ids_file.unlink()
    lp["llama.cpp"] = log_softmax(llama_logits(llm, seqs, batched=False))
    lp["llama.cpp batch"] = log_softmax(llama_logits(llm, seqs, batched=True))

    def stats(ref: str, x: str) -> dict:
        d = kl(lp[ref], lp[x])
        top = (lp[ref].argmax(-1) == lp[x].argmax(-1)).mean()
        return {"pair": f"KL({ref} || {x})", "mean": d.mean(), "median": float(np.median(d)),
                "p95": float(np.percentile(d, 95)), "max": d.max(), "top1": top}

    rows = [stats("exact", x) for x in ("float", "int8", "llama.cpp", "llama.cpp batch")]
    rows += [stats("llama.cpp", x) for x in ("int8", "float", "llama.cpp batch")]
    report = {"model": str(args.model), "sequences": [len(s) for s in seqs], "positions": n,
              "threads": args.threads, "llama_cpp_python": llama_cpp.__version__,
              "rows": [{k: (float(v) if k != "pair" else v) for k, v in r.items()} for r in rows]}
    if args.json:
        print(json.dumps(report, indent=1))
        return
    print(f"{args.model.name}: {len(seqs)} sequences, {n} positions ({report['sequences']})")
    print(f"{'':30} {'mean':>9} {'median':>9} {'p95':>9} {'max':>9} {'top-1':>7}")
    for r in rows:
        print(f"{r['pair']:30} {r['mean']:9.2e} {r['median']:9.2e} {r['p95']:9.2e} {r['max']:9.2e} {r['top1']:7.1%}")


if __name__ == "__main__":
    main()
