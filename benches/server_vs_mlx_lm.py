#!/usr/bin/env python3
"""HTTP serving speed: `weft serve` vs `mlx_lm.server` on the same model, in the same run.

Both servers are started here on free loopback ports and sent the same streaming
/v1/chat/completions requests at 1, 4, 8 and 16 concurrent streams. Each request asks for
exactly --max-tokens tokens (greedy; Weft gets `ignore_eos`, mlx_lm.server, which has no such
field, a -100 logit_bias on the EOS ids), so every stream has the same length. Measured per concurrency level:

- agg tok/s: completion tokens of all streams / wall time from the first request sent to the
  last stream finished;
- TTFT p50 / p95: request sent until the first content chunk arrived, over all streams.

Every prompt opens with a unique system message, so no request shares a prompt prefix with
another (mlx_lm.server's prompt cache and Weft's, both on by default, find nothing
to reuse): both servers prefill every prompt in full.

    .venv/bin/python benches/server_vs_mlx_lm.py                       # the default model
    .venv/bin/python benches/server_vs_mlx_lm.py --model path/to/mlx-lm-dir
    .venv/bin/python benches/server_vs_mlx_lm.py --model model.gguf --mlx-model converted-dir

mlx_lm.server cannot read GGUF: for the default model's GGUF the default --mlx-model is
goldens/.work/smollm2 (written by `.venv/bin/python goldens/make_goldens.py --only smollm2`).
"""
import argparse
import concurrent.futures
import http.client
import json
import os
import pathlib
import platform
import socket
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
TOPICS = ["the sea", "a mountain", "a city at night", "an old library", "a robot", "the desert", "a garden",
          "a lighthouse", "a train journey", "the moon", "a forest", "a river", "a market", "winter", "a castle",
          "a spaceship"]


RETRIES = {}  # port -> connections reset and retried


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port, proc, what, timeout=600):
    start = time.time()
    while time.time() - start < timeout:
        if proc.poll() is not None:
            sys.exit(f"{what} exited with {proc.returncode} before it was ready")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    sys.exit(f"{what} not ready after {timeout}s")


def stream_once(port, model, prompt, max_tokens, no_eos, tag="warm-up"):
    """One streaming chat request; returns (ttft_s, tokens, total_s)."""
    body = {
        "model": model,
        # The unique tag opens the prompt, so no prefix is shared with another request.
        "messages": [{"role": "system", "content": f"[{tag}] You tell stories."}, {"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        **no_eos,
    }
    start = time.perf_counter()
    # mlx_lm.server's listen backlog (Python's default of 5) overflows when many clients connect
    # at once and the kernel resets some connections: retry those, timing from the first try.
    for attempt in range(20):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=1800)
            c.request("POST", "/v1/chat/completions", body=json.dumps(body),
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            break
        except (ConnectionResetError, ConnectionRefusedError, BrokenPipeError):
            RETRIES[port] = RETRIES.get(port, 0) + 1
            time.sleep(0.05 * (attempt + 1))
    else:
        raise RuntimeError("connection reset 20 times")
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
    ttft, chunks = None, 0
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        for choice in chunk.get("choices", []):
            if (choice.get("delta") or {}).get("content"):
                chunks += 1
                if ttft is None:
                    ttft = time.perf_counter() - start
    c.close()
    return ttft, chunks, time.perf_counter() - start


def percentile(xs, p):
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def run_level(port, model, streams, max_tokens, no_eos, tag):
    prompts = [(f"{tag}-{i}", f"Write a short story about {TOPICS[i % len(TOPICS)]}.") for i in range(streams)]
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(streams) as pool:
        results = list(pool.map(lambda p: stream_once(port, model, p[1], max_tokens, no_eos, p[0]), prompts))
    wall = time.perf_counter() - start
    ttfts = [r[0] for r in results if r[0] is not None]
    tokens = sum(r[1] for r in results)
    return {
        "streams": streams,
        "agg_tok_s": tokens / wall,
        "ttft_p50_ms": percentile(ttfts, 50) * 1000,
        "ttft_p95_ms": percentile(ttfts, 95) * 1000,
        "tokens": tokens,
        "wall_s": wall,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="what weft serves (mlx-lm dir or .gguf); default: the default model")
    ap.add_argument("--mlx-model", help="what mlx_lm.server serves (an mlx-lm dir)")
    ap.add_argument("--weft", default=str(ROOT / "target/release/weft"))
    ap.add_argument("--concurrency", default="1,4,8,16")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--eos", default="2", help="EOS token ids to suppress, comma-separated (SmolLM2: 2)")
    ap.add_argument("--only", choices=["weft", "mlx_lm"], help="run one server only")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    model = args.model
    if model is None:
        model = subprocess.run([args.weft, "pull"], capture_output=True, text=True, check=True).stdout.strip()
    mlx_model = args.mlx_model
    if mlx_model is None:
        if pathlib.Path(model).is_dir():
            mlx_model = model
        elif pathlib.Path(model).name == "SmolLM2-135M-Instruct.Q4_1.gguf":
            mlx_model = str(ROOT / "goldens/.work/smollm2")
        else:
            sys.exit("mlx_lm.server cannot read GGUF: pass --mlx-model with an equivalent mlx-lm directory")
    if args.only != "weft" and not pathlib.Path(mlx_model, "config.json").exists():
        sys.exit(f"{mlx_model} is missing: run `.venv/bin/python goldens/make_goldens.py --only smollm2`")
    levels = [int(x) for x in args.concurrency.split(",")]
    eos_ids = [int(x) for x in args.eos.split(",") if x]
    log = open(os.devnull, "w")

    # Exactly max_tokens per stream: Weft has `ignore_eos` (its plain greedy path stays
    # pipelined); mlx_lm.server has no such field, so its EOS ids get a -100 logit bias.
    servers = {}
    if args.only != "mlx_lm":
        port = free_port()
        p = subprocess.Popen([args.weft, "serve", "--model", model, "--port", str(port), "--log-level", "WARNING",
                              "--decode-concurrency", "32"], stdout=log, stderr=log)
        servers["weft"] = (port, p, model, {"ignore_eos": True})
    if args.only != "weft":
        port = free_port()
        p = subprocess.Popen([sys.executable, "-m", "mlx_lm.server", "--model", mlx_model, "--port", str(port),
                              "--log-level", "WARNING", "--decode-concurrency", "32"], stdout=log, stderr=log)
        servers["mlx_lm"] = (port, p, mlx_model, {"logit_bias": {str(t): -100 for t in eos_ids}})
    try:
        for name, (port, p, m, no_eos) in servers.items():
            wait_ready(port, p, name)
            stream_once(port, m, "[warm-up] Hi", 4, no_eos)
        results = {name: [] for name in servers}
        for n, streams in enumerate(levels):
            order = list(servers) if n % 2 == 0 else list(reversed(servers))  # flip who goes first
            for name in order:
                port, _, m, no_eos = servers[name]
                r = run_level(port, m, streams, args.max_tokens, no_eos, f"{name}{streams}")
                results[name].append(r)
                if not args.json:
                    print(f"  {name:7} {streams:3} streams: {r['agg_tok_s']:8.1f} tok/s  TTFT p50 "
                          f"{r['ttft_p50_ms']:8.0f} ms  p95 {r['ttft_p95_ms']:8.0f} ms", file=sys.stderr)
    finally:
        for _, p, _, _ in servers.values():
            p.terminate()
        for _, p, _, _ in servers.values():
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()

    meta = {
        "weft_model": model, "mlx_model": mlx_model, "max_tokens": args.max_tokens,
        "machine": f"{platform.machine()} {os.cpu_count()} cpus", "load_avg": os.getloadavg(),
        "date": time.strftime("%Y-%m-%d"),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                 text=True).stdout.strip(),
    }
    try:
        import mlx_lm
        meta["mlx_lm_version"] = mlx_lm.__version__
    except Exception:
        pass
    meta["connection_retries"] = {name: RETRIES.get(port, 0) for name, (port, _, _, _) in servers.items()}
    if args.json:
        print(json.dumps({"meta": meta, "results": results}, indent=1))
        return
    print(f"weft:   {model}\nmlx-lm: {mlx_model}  (mlx-lm {meta.get('mlx_lm_version', '?')})")
    print(f"streaming chat completions, {args.max_tokens} tokens each (EOS suppressed), greedy")
    print(f"{'streams':>7} | {'weft tok/s':>10} {'mlx-lm tok/s':>12} {'ratio':>6} | "
          f"{'weft TTFT p50/p95 ms':>21} | {'mlx-lm TTFT p50/p95 ms':>23}")
    for i, streams in enumerate(levels):
        w = results.get("weft", [None] * len(levels))[i]
        m = results.get("mlx_lm", [None] * len(levels))[i]
        fmt = lambda r: f"{r['agg_tok_s']:.1f}" if r else "-"
        ttft = lambda r: f"{r['ttft_p50_ms']:.0f} / {r['ttft_p95_ms']:.0f}" if r else "-"
        ratio = f"{w['agg_tok_s'] / m['agg_tok_s']:.2f}" if w and m else "-"
        print(f"{streams:>7} | {fmt(w):>10} {fmt(m):>12} {ratio:>6} | {ttft(w):>21} | {ttft(m):>23}")
    print(f"(load average at the end: {' '.join(f'{x:.2f}' for x in meta['load_avg'])})")
    for name, (port, _, _, _) in servers.items():
        if RETRIES.get(port):
            print(f"({name}: {RETRIES[port]} connection(s) reset by the server and retried)")


if __name__ == "__main__":
    main()
