#!/usr/bin/env python3
"""Multi-turn agent prompt caching: `weft serve` vs `mlx_lm.server` on the same model.

An agent resends the whole conversation every turn: a long system prompt with tool schemas,
then the history. Each server gets the same 5-turn conversation (greedy, streamed
/v1/chat/completions); each turn appends the server's own answer and a new user message.
Measured per turn: TTFT (request sent until the first streamed chunk) and the share of the
prompt the server says it served from its cache (`usage.prompt_tokens_details.cached_tokens`,
asked for with `stream_options.include_usage`; mlx_lm.server reports none, shown as "-").
The goal (issue 30): from turn 2 on, >= 90% of the prompt cached on every cache kind (full
attention, sliding window, hybrid recurrent) with default flags, and TTFT of turn N within
1.5x of a one-message request of the new tokens alone (the "fresh" row).

    .venv/bin/python benches/agent_turns.py --model path/to/mlx-lm-dir
    .venv/bin/python benches/agent_turns.py --model gemma-3-270m.gguf --mlx-model converted-dir
    .venv/bin/python benches/agent_turns.py --model DIR --only weft --system-tokens 16000

Not run in CI (it starts real servers on real models); results go to docs/benchmarks.md.
"""
import argparse
import http.client
import json
import subprocess
import sys
import time

from server_vs_mlx_lm import free_port, wait_ready

TOOLS = [
    {"type": "function", "function": {
        "name": name, "description": f"{desc} " * 8,
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string", "description": "A path relative to the repository root."},
            "args": {"type": "array", "items": {"type": "string"}}}, "required": ["path"]}}}
    for name, desc in [("read_file", "Reads a file and returns its text."),
                       ("write_file", "Writes text to a file, replacing it."),
                       ("run", "Runs a shell command in the repository and returns its output."),
                       ("search", "Searches the repository for a regular expression.")]
]

USER_TURNS = [
    "List the files in the repository and tell me what the project does.",
    "Open the README and summarize the build steps.",
    "Which tests cover the prompt cache?",
    "Run the unit tests of the engine and report failures.",
    "Propose a fix for the first failure.",
]


def system_prompt(tokens):
    """About `tokens` tokens of agent instructions (4 characters a token, roughly)."""
    rule = ("Follow the repository's conventions. Prefer small, reviewable changes. Never run "
            "destructive commands without asking. Explain what you changed and why. ")
    text = "You are a coding agent working in a git repository. "
    while len(text) < tokens * 4:
        text += rule
    return text


def turn(port, model, messages, max_tokens, extra, tools=True):
    """One streamed greedy turn: (ttft_s, answer text, prompt tokens, cached tokens or None)."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}, **extra}
    if tools:
        body["tools"] = TOOLS
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    start = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        sys.exit(f"port {port}: HTTP {resp.status}: {resp.read()[:500]!r}")
    ttft, text, usage = None, "", {}
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[5:])
        if chunk.get("usage"):
            usage = chunk["usage"]
        for choice in chunk.get("choices", []):
            delta = choice.get("delta", {})
            piece = delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning") or ""
            if (piece or delta.get("tool_calls")) and ttft is None:
                ttft = time.perf_counter() - start
            text += delta.get("content") or ""
    conn.close()
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    return ttft or (time.perf_counter() - start), text, usage.get("prompt_tokens", 0), cached


def conversation(port, model, system, turns, max_tokens, extra):
    messages = [{"role": "system", "content": system}]
    rows = []
    for i in range(turns):
        messages.append({"role": "user", "content": USER_TURNS[i % len(USER_TURNS)]})
        ttft, text, prompt, cached = turn(port, model, messages, max_tokens, extra)
        messages.append({"role": "assistant", "content": text or "(no answer)"})
        # The new tokens alone, as a one-message request: what a perfect cache would cost.
        fresh, _, _, _ = turn(port, model, [{"role": "user", "content": f"[{i}] " + USER_TURNS[i % len(USER_TURNS)]}],
                              max_tokens, extra, tools=False)
        rows.append({"turn": i + 1, "ttft_s": ttft, "prompt_tokens": prompt, "cached_tokens": cached, "fresh_ttft_s": fresh})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="what weft serves (mlx-lm dir or .gguf)")
    ap.add_argument("--mlx-model", help="what mlx_lm.server serves (an mlx-lm dir; default: --model)")
    ap.add_argument("--weft", default="target/release/weft")
    ap.add_argument("--system-tokens", type=int, default=4000)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--only", choices=["weft", "mlx_lm"])
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args()

    system = system_prompt(args.system_tokens)
    servers = {}
    if args.only != "mlx_lm":
        port = free_port()
        # Default flags: the prompt cache is on and sized from memory.
        p = subprocess.Popen([args.weft, "serve", "--model", args.model, "--port", str(port), "--log-level", "WARNING"])
        servers["weft"] = (port, p, args.model)
    if args.only != "weft":
        mlx_model = args.mlx_model or args.model
        if mlx_model.endswith(".gguf"):
            sys.exit("mlx_lm.server cannot read GGUF: pass --mlx-model with an equivalent mlx-lm directory")
        port = free_port()
        p = subprocess.Popen([sys.executable, "-m", "mlx_lm.server", "--model", mlx_model, "--port", str(port)])
        servers["mlx_lm"] = (port, p, mlx_model)
    results = {}
    try:
        for name, (port, p, model) in servers.items():
            wait_ready(port, p, name)
        for name, (port, _, model) in servers.items():
            results[name] = conversation(port, model, system, args.turns, args.max_tokens, {})
    finally:
        for _, p, _ in servers.values():
            p.terminate()
        for _, p, _ in servers.values():
            p.wait()
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{args.turns} turns, ~{args.system_tokens}-token system prompt with {len(TOOLS)} tools, greedy, "
          f"{args.max_tokens} tokens a turn")
    print(f"{'server':8} {'turn':>4} {'prompt':>7} {'cached':>7} {'share':>6} {'TTFT s':>8} {'fresh s':>8} {'ratio':>6}")
    for name, rows in results.items():
        for r in rows:
            cached = r["cached_tokens"]
            share = f"{cached / r['prompt_tokens']:.0%}" if cached is not None and r["prompt_tokens"] else "-"
            ratio = r["ttft_s"] / r["fresh_ttft_s"] if r["fresh_ttft_s"] else float("nan")
            print(f"{name:8} {r['turn']:>4} {r['prompt_tokens']:>7} {cached if cached is not None else '-':>7} "
                  f"{share:>6} {r['ttft_s']:>8.3f} {r['fresh_ttft_s']:>8.3f} {ratio:>6.2f}")


if __name__ == "__main__":
    main()
