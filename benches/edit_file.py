#!/usr/bin/env python3
"""Copy-heavy single stream: "edit this file" through `weft serve`, with and without
prompt-lookup speculative decoding, and llama.cpp (llama-cpp-python) on the same GGUF with and
without its prompt-lookup drafting (`LlamaPromptLookupDecoding`), side by side (issue 31).

The request: a chat asking the model to return a given file (~1,000 tokens by default) with one
identifier renamed, greedy, up to --max-tokens. Most of the answer is copied from the prompt,
which is the workload prompt lookup speeds up. Per run:
  ttft_ms       request sent until the first streamed content
  decode_tok_s  (completion tokens - 1) / (first content .. last content)
Rounds alternate the settings; reported: medians over --rounds. Weft's greedy answers with and
without drafts must be the same text (checked, reported as `same_text`).

  # CPU, idle machine (llama.cpp from a venv outside the repository, see compare_llama_cpp.py):
  /work/llama-venv/bin/python benches/edit_file.py --threads 2
  # Weft alone (e.g. on the H200 with benches/gpu's bundle):
  python3 benches/edit_file.py --weft /tmp/weft-gpu/weft --only weft --model DIR
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_GGUF = Path.home() / ".cache/weft/models/smollm2-135m-instruct-q4_1/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_FILE = REPO / "core/src/stop.rs"


def edit_messages(path: Path, old: str, new: str) -> list[dict]:
    text = path.read_text()
    ask = (f"Here is a file:\n\n```\n{text}```\n\nRename `{old}` to `{new}` everywhere in it. "
           "Answer with the complete edited file and nothing else.")
    return [{"role": "user", "content": ask}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def weft_turn(port: int, messages: list[dict], max_tokens: int, drafts: int) -> dict:
    body = {"model": "weft", "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}, "num_draft_tokens": drafts}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    start = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        sys.exit(f"weft: HTTP {resp.status}: {resp.read()[:500]!r}")
    first = last = None
    text, usage = "", {}
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[5:])
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices", []):
            piece = (choice.get("delta") or {}).get("content") or ""
            if piece:
                last = time.perf_counter()
                first = first or last
                text += piece
    conn.close()
    n = usage.get("completion_tokens", 0)
    return {"ttft_ms": 1000 * ((first or time.perf_counter()) - start), "tokens": n,
            "decode_tok_s": (n - 1) / (last - first) if first and last and last > first else 0.0, "text": text}


def start_weft(args, port: int) -> subprocess.Popen:
    env = dict(os.environ)
    if args.threads:
        env["WEFT_CPU_THREADS"] = str(args.threads)
    cmd = [args.weft, "serve", "--model", str(args.model), "--port", str(port), "--prompt-cache-bytes", "0"]
    if args.weft_kernels:
        cmd += ["--cpu-kernels", args.weft_kernels]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 600
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"weft serve exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    sys.exit("weft serve did not come up in 600 s")


def llama_turn(llm, messages: list[dict], max_tokens: int) -> dict:
    llm.reset()  # no prefix reuse between runs
    start = time.perf_counter()
    first = last = None
    n, text = 0, ""
    for chunk in llm.create_chat_completion(messages=messages, temperature=0.0, top_k=1, max_tokens=max_tokens, stream=True):
        piece = chunk["choices"][0]["delta"].get("content") or ""
        if piece:
            last = time.perf_counter()
            first = first or last
            n += 1
            text += piece
    return {"ttft_ms": 1000 * ((first or time.perf_counter()) - start), "tokens": n,
            "decode_tok_s": (n - 1) / (last - first) if first and last and last > first else 0.0, "text": text}


def median_row(name: str, runs: list[dict]) -> dict:
    return {"engine": name, "runs": len(runs),
            "ttft_ms": statistics.median(r["ttft_ms"] for r in runs),
            "decode_tok_s": statistics.median(r["decode_tok_s"] for r in runs),
            "decode_tok_s_all": [round(r["decode_tok_s"], 1) for r in runs],
            "tokens": statistics.median(r["tokens"] for r in runs)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(DEFAULT_GGUF), help="what weft serves (and llama.cpp loads, a .gguf)")
    ap.add_argument("--weft", default=str(REPO / "target/release/weft"))
    ap.add_argument("--weft-kernels", choices=["fast", "exact"], help="weft's --cpu-kernels (default: its own)")
    ap.add_argument("--file", default=str(DEFAULT_FILE), help="the file to edit")
    ap.add_argument("--rename", default="FinishReason=StopReason", help="OLD=NEW")
    ap.add_argument("--max-tokens", type=int, default=1200)
    ap.add_argument("--drafts", type=int, default=8, help="draft tokens per step when speculating")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="CPU threads for both engines (0: each engine's default)")
    ap.add_argument("--only", choices=["weft", "llama"])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    old, new = args.rename.split("=", 1)
    messages = edit_messages(Path(args.file), old, new)

    settings = []
    proc = port = llm = llm_spec = None
    if args.only != "llama":
        port = free_port()
        proc = start_weft(args, port)
        settings += [("weft", lambda: weft_turn(port, messages, args.max_tokens, 0)),
                     (f"weft +{args.drafts} drafts", lambda: weft_turn(port, messages, args.max_tokens, args.drafts))]
    if args.only != "weft":
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        threads = args.threads or None
        common = dict(model_path=str(args.model), n_ctx=4096, n_threads=threads, n_threads_batch=threads, verbose=False)
        llm = Llama(**common)
        # logits_all: llama-cpp-python 0.3.36 sizes its score buffer from this argument, but
        # a draft model turns logits_all on inside, overrunning a buffer sized for one batch.
        llm_spec = Llama(**common, logits_all=True, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=args.drafts))
        settings += [("llama.cpp", lambda: llama_turn(llm, messages, args.max_tokens)),
                     (f"llama.cpp +{args.drafts} drafts", lambda: llama_turn(llm_spec, messages, args.max_tokens))]
    try:
        for _, run in settings:  # warm-up
            run()
        results = {name: [] for name, _ in settings}
        for i in range(args.rounds):
            order = settings if i % 2 == 0 else settings[::-1]
            for name, run in order:
                results[name].append(run())
    finally:
        if proc:
            proc.terminate()
            proc.wait()
    rows = [median_row(name, runs) for name, runs in results.items()]
    texts = {name: {r["text"] for r in runs} for name, runs in results.items()}
    if args.only != "llama":
        rows[0]["same_text"] = texts["weft"] == texts[f"weft +{args.drafts} drafts"] and len(texts["weft"]) == 1
    base = {r["engine"]: r["decode_tok_s"] for r in rows}
    prompt_chars = len(messages[0]["content"])
    if args.json:
        answers = {name: runs[0]["text"] for name, runs in results.items()}
        print(json.dumps({"file": args.file, "prompt_chars": prompt_chars, "rows": rows, "answers": answers}, indent=1))
        return
    print(f"file {args.file} ({prompt_chars} chars), max_tokens {args.max_tokens}, rounds {args.rounds}")
    print(f"{'engine':<24}{'ttft ms':>10}{'decode tok/s':>14}{'tokens':>8}  runs / ratios")
    for r in rows:
        ratios = []
        if "weft" in base and r["engine"] != "weft":
            ratios.append(f"{r['decode_tok_s'] / base['weft']:.2f}x weft")
        if "llama.cpp" in base and r["engine"] != "llama.cpp":
            ratios.append(f"{r['decode_tok_s'] / base['llama.cpp']:.2f}x llama.cpp")
        print(f"{r['engine']:<24}{r['ttft_ms']:>10.1f}{r['decode_tok_s']:>14.1f}{r['tokens']:>8.0f}  "
              f"{r['decode_tok_s_all']} {' '.join(ratios)}" + (f" same_text={r['same_text']}" if "same_text" in r else ""))


if __name__ == "__main__":
    main()
