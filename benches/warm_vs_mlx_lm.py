#!/usr/bin/env python3
"""Warm engines side by side: Weft (`weft bench --json`, one subprocess: the model is loaded
once, weights evaluated at load, one warm-up run per batch size) and mlx-lm's BatchGenerator
(this process: model loaded, parameters evaluated, one warm-up run per batch size) on the same
model directory, batch sizes, prompt length, generation length and repeats, in one run.
Prints a table of Weft / mlx-lm ratios and writes every figure as JSON.

Needs only python3 with mlx + mlx-lm and a built `weft` binary (no cargo):

    python3 benches/warm_vs_mlx_lm.py --weft target/release/weft --model goldens/models/llama-bf16
    python3 benches/warm_vs_mlx_lm.py --weft ./weft --make-model llama-1b-4bit --batch 1,8,32,64
    python3 benches/warm_vs_mlx_lm.py --weft ./weft --make-model llama-8b-4bit --batch 1 --weft-env WEFT_COMPILE=0

`--weft-env KEY=VALUE` sets a variable for the weft process only (e.g. `WEFT_COMPILE=0|1`: the
decode step's SwiGLU/GeGLU as MLX-compiled kernels, on by default on a GPU); it is recorded in
the JSON.

`--make-model SHAPE` writes a random-weight model of a real shape with mlx-lm's own classes
(mlx_lm.utils._get_classes, a dtype cast as mlx_lm.convert does, quantize_model, save_model,
save_config) into --model-dir (default /tmp/weft-bench-models/SHAPE) and runs on it; no
tokenizer is written, both engines take prompt ids. Shapes: see SHAPES below.

Metrics, identical on both sides (timed from submission of the whole batch):
  agg tok/s     = generated tokens / wall time to the last token
  decode tok/s  = tokens after each row's first / time from the last row's first token to the end
  ttft p50 ms   = median over rows of the time to the row's first token
  prefill tok/s = batch * prompt_len / time until every row has its first token
Ratios are Weft / mlx-lm, except TTFT: mlx-lm / Weft. Above 1 means Weft is better for all four.
Both engines admit the whole batch to prefill at once (mlx-lm prefill_batch_size =
completion_batch_size = B; Weft prompt_concurrency = max_batch = the largest B).
"""
import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time

import mlx.core as mx
import mlx_lm
from mlx_lm.generate import BatchGenerator
from mlx_lm.sample_utils import make_sampler
from mlx_lm.utils import load_model

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}


def llama(hidden, inter, layers, heads, kv_heads, vocab, tie, rope_theta=500000.0, rope_scaling=None,
          head_dim=None, max_pos=131072):
    c = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": hidden,
         "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
         "num_key_value_heads": kv_heads, "vocab_size": vocab, "rms_norm_eps": 1e-5,
         "rope_theta": rope_theta, "tie_word_embeddings": tie, "max_position_embeddings": max_pos,
         "attention_bias": False, "mlp_bias": False}
    if rope_scaling:
        c["rope_scaling"] = rope_scaling
    if head_dim:
        c["head_dim"] = head_dim
    return c


def qwen3_5(hidden, inter, layers, heads, kv_heads, head_dim, lin_k_heads, lin_v_heads, lin_dim, vocab):
    """A dense Qwen3.5 hybrid (mlx-lm `qwen3_5`): every 4th layer full attention, the others gated
    DeltaNet; nested text_config as the released checkpoints have it; tied embeddings."""
    text = {"model_type": "qwen3_5_text", "hidden_size": hidden, "intermediate_size": inter,
            "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
            "head_dim": head_dim, "linear_num_key_heads": lin_k_heads, "linear_num_value_heads": lin_v_heads,
            "linear_key_head_dim": lin_dim, "linear_value_head_dim": lin_dim, "linear_conv_kernel_dim": 4,
            "full_attention_interval": 4, "rms_norm_eps": 1e-6, "vocab_size": vocab,
            "max_position_embeddings": 262144, "tie_word_embeddings": True,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0,
                                "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10]}}
    return {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
            "tie_word_embeddings": True, "text_config": text}


# name -> (config, dtype, quantization bits or None)
BASES = {
    "llama-1b": llama(2048, 8192, 16, 32, 8, 128256, True, rope_scaling=LLAMA3_ROPE, head_dim=64),
    "llama-8b": llama(4096, 14336, 32, 32, 8, 128256, False, rope_scaling={**LLAMA3_ROPE, "factor": 8.0}),
    # The default model's shape (SmolLM2-135M).
    "smollm2-135m": llama(576, 1536, 30, 9, 3, 49152, True, rope_theta=100000.0, max_pos=8192),
    "qwen3-moe-small": {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"],
                        "hidden_size": 1024, "intermediate_size": 2048, "moe_intermediate_size": 512,
                        "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 4,
                        "head_dim": 64, "num_experts": 32, "num_experts_per_tok": 4,
                        "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
                        "vocab_size": 32000, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                        "tie_word_embeddings": False, "max_position_embeddings": 32768},
    # Qwen3-30B-A3B's layer shape (hidden 2048, 32 query / 4 KV heads of 128, 128 experts of
    # width 768, 8 active, vocab 151936) with 24 of its 48 layers, so the bfloat16 weights made
    # before quantizing (~30 GB) fit an 80 GB card.
    "qwen3-moe-a3b": {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"],
                      "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
                      "num_hidden_layers": 24, "num_attention_heads": 32, "num_key_value_heads": 4,
                      "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
                      "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
                      "vocab_size": 151936, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                      "tie_word_embeddings": False, "max_position_embeddings": 40960},
    # Qwen3.5-4B's published shape (hidden 2560, 32 layers, 16 query / 4 KV heads of 256,
    # vocab 248320); the DeltaNet head counts (16 key / 32 value heads of 128) and the MLP width
    # (9216) are Qwen3-Next's ratios, not read from the released config.
    "qwen3_5-4b": qwen3_5(2560, 9216, 32, 16, 4, 256, 16, 32, 128, 248320),
    # A small hybrid for the CPU (8 layers: 6 DeltaNet, 2 attention).
    "qwen3_5-small": qwen3_5(512, 1536, 8, 8, 2, 64, 4, 8, 64, 32000),
}
SHAPES = {f"{base}-{kind}": (base, kind) for base in BASES for kind in ("bf16", "4bit", "fp32")}


def make_model(shape, out_dir, seed=0):
    """A random-weight model of `shape` written with mlx-lm's own classes."""
    from mlx.utils import tree_flatten, tree_map_with_path
    from mlx_lm.utils import _get_classes, quantize_model, save_config, save_model

    base, kind = SHAPES[shape]
    config = dict(BASES[base])
    out = pathlib.Path(out_dir)
    if (out / "config.json").exists():
        return out
    mx.random.seed(seed)
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    # mlx_lm.convert's set_dtype: floating parameters to bfloat16, except those the model's
    # cast_predicate keeps (Qwen3.5's A_log); fp32 (for MLX's CPU backend) keeps everything.
    keep = getattr(model, "cast_predicate", lambda _: True)
    if kind != "fp32":
        model.update(tree_map_with_path(
            lambda p, v: v.astype(mx.bfloat16) if keep(p) and mx.issubdtype(v.dtype, mx.floating) else v,
            model.parameters()))
    mx.eval(model.parameters())
    if kind == "4bit":
        model, config = quantize_model(model, config, 64, 4)
    config["torch_dtype"] = "float32" if kind == "fp32" else "bfloat16"
    save_model(out, model)
    save_config(config, out / "config.json")
    print(f"made {shape}: {sum(v.size for _, v in tree_flatten(model.parameters())) / 1e6:.0f}M stored elements"
          f" in {out}", file=sys.stderr)
    return out


def random_prompts(seed, count, length, vocab):
    """The xorshift stream `weft bench` uses (cli/src/bench.rs), so both sides see the same ids."""
    mask = (1 << 64) - 1
    state = ((seed * 0x9E3779B97F4A7C15) & mask) | 1
    out = []
    for _ in range(count):
        row = []
        for _ in range(length):
            state ^= (state << 13) & mask
            state ^= state >> 7
            state ^= (state << 17) & mask
            row.append(state % vocab)
        out.append(row)
    return out


def mlx_lm_once(model, prompts, gen, prefill_step_size, temp=0.0, top_p=1.0):
    batch = len(prompts)
    sampler = make_sampler(temp=temp, top_p=top_p) if temp > 0 else None
    g = BatchGenerator(model, max_tokens=gen, stop_tokens=[], completion_batch_size=batch,
                       prefill_batch_size=batch, prefill_step_size=prefill_step_size, sampler=sampler)
    start = time.perf_counter()
    uids = g.insert(prompts, [gen] * batch)
    first = {}
    tokens = 0
    while responses := g.next_generated():
        now = time.perf_counter() - start
        for r in responses:
            tokens += 1
            first.setdefault(r.uid, now)
    wall = time.perf_counter() - start
    g.close()
    ttfts = sorted(first[u] for u in uids)
    last_first = ttfts[-1]
    return {
        "agg_tok_s": tokens / wall,
        "decode_tok_s": (tokens - batch) / max(wall - last_first, 1e-9),
        "prefill_tok_s": batch * len(prompts[0]) / max(last_first, 1e-9),
        "ttft_p50_ms": ttfts[len(ttfts) // 2] * 1000,
    }


def mlx_lm_bench(model_dir, batches, prompt_len, gen, runs, seed, prefill_step_size, temp=0.0, top_p=1.0):
    model, config = load_model(pathlib.Path(model_dir))
    mx.eval(model.parameters())
    vocab = config.get("vocab_size") or config["text_config"]["vocab_size"]
    results = []
    for b in batches:
        prompts = random_prompts(seed, b, prompt_len, vocab)
        mlx_lm_once(model, prompts, 4, prefill_step_size, temp, top_p)  # warm-up
        samples = [mlx_lm_once(model, prompts, gen, prefill_step_size, temp, top_p) for _ in range(runs)]
        results.append({"batch": b, **{k: statistics.median(s[k] for s in samples) for k in samples[0]},
                        "samples": samples})
    return results


def weft_bench(weft, model, batches, prompt_len, gen, runs, seed, prefill_step_size, temp=0.0, top_p=1.0, env=None):
    cmd = [weft, "bench", "--model", str(model), "--batch", ",".join(map(str, batches)),
           "--prompt-len", str(prompt_len), "--gen", str(gen), "--runs", str(runs),
           "--seed", str(seed), "--prefill-step-size", str(prefill_step_size), "--json"]
    if temp > 0:
        # Every row sampled, as mlx-lm's shared sampler does; `--sampled` counts rows of a batch.
        rows = []
        for b in batches:
            one = cmd[:]
            one[one.index("--batch") + 1] = str(b)
            one += ["--sampled", str(b), "--temp", str(temp), "--top-p", str(top_p)]
            rows += json.loads(subprocess.run(one, check=True, capture_output=True, text=True, env=env).stdout)["results"]
        cmd = cmd + ["--sampled", "B", "--temp", str(temp), "--top-p", str(top_p)]
    else:
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
        rows = json.loads(out)["results"]
    for r in rows:
        r["ttft_p50_ms"] = r.get("ttft_p50_ms", r["ttft_ms"])
    return rows, cmd


METRICS = ["agg_tok_s", "decode_tok_s", "ttft_p50_ms", "prefill_tok_s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weft", default="target/release/weft", help="the weft binary")
    ap.add_argument("--model", help="model directory both engines run")
    ap.add_argument("--weft-model", help="what Weft runs instead of --model (e.g. a .gguf of the same weights)")
    ap.add_argument("--make-model", choices=sorted(SHAPES), help="create a random-weight model of this shape")
    ap.add_argument("--model-dir", help="where --make-model writes (default /tmp/weft-bench-models/SHAPE)")
    ap.add_argument("--batch", default="1,4,8,16", help="batch sizes, comma-separated")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3, help="measured runs per batch size per engine (medians)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="alternate the engines this many times (order flips each round); figures are medians "
                         "of the per-round medians (use 3 on a busy machine)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prefill-step-size", type=int, default=2048)
    ap.add_argument("--temp", type=float, default=0.0,
                    help="sample every row at this temperature (0 = greedy); Weft needs `weft bench --sampled`")
    ap.add_argument("--top-p", type=float, default=1.0, help="nucleus threshold of sampled rows")
    ap.add_argument("--weft-env", action="append", default=[], metavar="KEY=VALUE",
                    help="an environment variable for the weft process only (repeatable), e.g. WEFT_COMPILE=0 "
                         "to turn compiled elementwise chains off (docs/building.md lists the variables)")
    ap.add_argument("--out", default="warm_vs_mlx_lm.json", help="JSON output file")
    a = ap.parse_args()
    weft_env = dict(os.environ)
    for kv in a.weft_env:
        key, eq, value = kv.partition("=")
        if not eq:
            sys.exit(f"--weft-env {kv!r}: expected KEY=VALUE")
        weft_env[key] = value
    if a.make_model:
        model_dir = make_model(a.make_model, a.model_dir or f"/tmp/weft-bench-models/{a.make_model}")
    elif a.model:
        model_dir = pathlib.Path(a.model)
    else:
        sys.exit("give --model DIR or --make-model SHAPE")
    if str(model_dir).endswith(".gguf"):
        sys.exit("mlx-lm cannot load GGUF: --model must be a directory (use --weft-model for the GGUF)")
    batches = [int(b) for b in a.batch.split(",")]
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    load_start = os.getloadavg()
    rounds = []
    for i in range(max(a.rounds, 1)):
        run_weft = lambda: weft_bench(a.weft, a.weft_model or model_dir, batches, a.prompt_len, a.gen, a.runs,
                                      a.seed, a.prefill_step_size, a.temp, a.top_p, weft_env)
        run_mlx = lambda: mlx_lm_bench(model_dir, batches, a.prompt_len, a.gen, a.runs, a.seed, a.prefill_step_size,
                                       a.temp, a.top_p)
        if i % 2 == 0:
            (ours, cmd), theirs = run_weft(), run_mlx()
        else:
            theirs = run_mlx()
            ours, cmd = run_weft()
        rounds.append({"weft": ours, "mlx_lm": theirs})
    rows = []
    for j, b in enumerate(batches):
        w = {k: statistics.median(r["weft"][j][k] for r in rounds) for k in METRICS}
        m = {k: statistics.median(r["mlx_lm"][j][k] for r in rounds) for k in METRICS}
        ratio = {k: (m[k] / w[k] if k == "ttft_p50_ms" else w[k] / m[k]) for k in METRICS}
        rows.append({"batch": b, "weft": w, "mlx_lm": m, "ratio": ratio})
    doc = {"model": str(model_dir), "weft_model": str(a.weft_model or model_dir), "make_model": a.make_model,
           "prompt_len": a.prompt_len, "gen": a.gen, "runs": a.runs, "seed": a.seed,
           "prefill_step_size": a.prefill_step_size, "temp": a.temp, "top_p": a.top_p, "weft_command": cmd, "weft_env": a.weft_env, "argv": sys.argv,
           "mlx_version": mx.__version__, "mlx_lm_version": mlx_lm.__version__,
           "machine": platform.platform(), "cpus": os.cpu_count(), "started": started,
           "loadavg_start": load_start, "loadavg_end": os.getloadavg(), "rows": rows, "rounds": rounds}
    pathlib.Path(a.out).write_text(json.dumps(doc, indent=1))
    print(f"model {model_dir}  prompt {a.prompt_len}  gen {a.gen}  medians of {a.runs} x {a.rounds} round(s)  "
          f"(ratio Weft/mlx-lm; TTFT mlx-lm/Weft; >1 = Weft better)  JSON: {a.out}")
    print(f"{'B':>3} | {'agg tok/s weft':>14} {'mlx-lm':>8} {'ratio':>6} | {'decode weft':>11} {'mlx-lm':>8} {'ratio':>6} "
          f"| {'ttft p50 ms':>11} {'mlx-lm':>8} {'ratio':>6} | {'prefill weft':>12} {'mlx-lm':>8} {'ratio':>6}")
    for r in rows:
        w, m, q = r["weft"], r["mlx_lm"], r["ratio"]
        print(f"{r['batch']:>3} | {w['agg_tok_s']:>14.1f} {m['agg_tok_s']:>8.1f} {q['agg_tok_s']:>6.2f} | "
              f"{w['decode_tok_s']:>11.1f} {m['decode_tok_s']:>8.1f} {q['decode_tok_s']:>6.2f} | "
              f"{w['ttft_p50_ms']:>11.1f} {m['ttft_p50_ms']:>8.1f} {q['ttft_p50_ms']:>6.2f} | "
              f"{w['prefill_tok_s']:>12.1f} {m['prefill_tok_s']:>8.1f} {q['prefill_tok_s']:>6.2f}")


if __name__ == "__main__":
    main()
