#!/usr/bin/env python3
"""Tensor-parallel goldens: mlx-lm's own sharded models on 2 ranks of MLX's ring backend.

Usage (from the repo root; the script starts itself under mlx.launch when run bare):
    .venv/bin/python goldens/make_distributed_goldens.py
which runs
    .venv/bin/mlx.launch --backend ring -n 2 --python .venv/bin/python \
        goldens/make_distributed_goldens.py

Each rank loads the tiny golden models (goldens/models/NAME, made by make_goldens.py),
shards one copy with mlx-lm's `Model.shard(group)` (mlx `shard_linear`: q/k/v/gate/up
all-to-sharded, o/down sharded-to-all with an all_sum) and keeps one copy whole, then runs
make_goldens.single_greedy (greedy generate_step, EOS ignored, first-step logits recorded) on
both (qwen3_moe: mlx-lm's Qwen3-MoE shard(): attention and the dense MLP layer as above, the
experts' SwitchGLU split in place, the router replicated, the block all_sums); models with mlx-lm's pipeline split (`model.model.pipeline(group)`: contiguous layer
ranges, rank 0 the last layers, hidden states by send/recv_like, all_gather at the end) get
the same cases pipelined. Rank 0 writes goldens/distributed.json; it checks that rank 1 produced the same
tokens and logits (every rank computes the same all_sum). Deterministic: re-running rewrites
a byte-identical file.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import make_goldens as mg  # noqa: E402  (the project's own golden helpers)
import mlx_lm.utils as lm_utils  # noqa: E402
from mlx_lm.generate import generation_stream  # noqa: E402

MODELS = ["llama-fp32", "llama-4bit", "qwen3", "qwen2", "qwen3_moe", "ministral3"]
# mlx-lm pipelines (PipelineMixin) these of the tiny models (no llama or qwen3).
PIPELINE_MODELS = ["qwen2", "qwen3_moe", "ministral3", "qwen3_next", "qwen3_5"]
# Pipelined only: mlx-lm 0.32.2 has no shard() for qwen3_next; Weft shards no qwen3_5 yet.
PIPELINE_ONLY_MODELS = ["qwen3_next", "qwen3_5"]
# Models whose sharded (and pipelined) runs also get a BatchGenerator continuous schedule
# (rows joining and leaving a batch, chunked prefill), replayed through Weft's engine.
SCHEDULE_MODELS = ["qwen3_moe"]
SCHEDULE_PREFILL_STEP = 8
PROMPT_LENS = [1, 7, 23]
CHUNKED = (23, 8)  # the 23-token prompt again, prefilled in chunks of 8
MAX_TOKENS = 16
WORLD = 2


def relaunch():
    launcher = Path(sys.executable).with_name("mlx.launch")
    cmd = [str(launcher if launcher.exists() else shutil.which("mlx.launch")), "--backend", "ring",
           "-n", str(WORLD), "--python", sys.executable, str(Path(__file__).resolve())]
    print("[distributed goldens]", " ".join(cmd), flush=True)
    sys.exit(subprocess.call(cmd))


def bit_equal(a, b):
    return np.array_equal(np.array(a, dtype=np.float32).view(np.uint32),
                          np.array(b, dtype=np.float32).view(np.uint32))


def same_on_every_rank(group, values):
    """all_gather a flat float32 vector; True when every rank's equals this one's bit for bit."""
    x = mx.array(np.array(values, dtype=np.float32))
    gathered = np.array(mx.distributed.all_gather(x[None], group=group, stream=mx.cpu))
    return all(bit_equal(row, gathered[0]) for row in gathered)


def compare(runs, single, key):
    for c, s in zip(runs, single):
        assert c["prompt_ids"] == s["prompt_ids"]
        c[f"{key}_equals_single"] = c["tokens"] == s["tokens"]
        c[f"{key}_logits_bit_equal_single"] = bool(bit_equal(c["first_logits"], s["first_logits"]))
        c[f"{key}_max_abs_logit_diff"] = float(np.max(np.abs(
            np.array(c["first_logits"], dtype=np.float64) - np.array(s["first_logits"], dtype=np.float64))))
        c["single_tokens"] = s["tokens"]


def settle():
    """Waits for the work a generation left queued: generate_step evaluates one step ahead, and
    a sharded step still in flight holds collectives that the next case's (or the rank check's
    all_gather) could otherwise interleave with on the other stream, mixing their bytes (seen:
    "ranks disagree" on a busy machine). Only the order of work changes, not any result."""
    mx.synchronize(generation_stream)
    mx.synchronize()


def check_ranks_agree(group, name, runs):
    flat = [float(t) for c in runs for t in c["tokens"]] + [v for c in runs for v in c["first_logits"]]
    assert same_on_every_rank(group, flat), f"{name}: ranks disagree"


def cases_for(name, model, vocab):
    draw = mg.prompt_pool(f"{name}/tp{WORLD}", vocab)
    prompts = {n: draw(n) for n in PROMPT_LENS}
    runs = [(prompts[n], 2048) for n in PROMPT_LENS] + [(prompts[CHUNKED[0]], CHUNKED[1])]
    out = []
    for p, step in runs:
        res, _ = mg.single_greedy(model, p, MAX_TOKENS, prefill_step_size=step)
        settle()
        out.append({k: res[k] for k in ("prompt_ids", "prefill_step_size", "tokens", "first_logits")})
    return out


def schedule_rows(name, vocab):
    """make_goldens.goldens_tiny's schedule shape, with prompts of this file's own."""
    draw = mg.prompt_pool(f"{name}/tp{WORLD}/schedule", vocab)
    return [
        {"prompt_ids": draw(9), "max_tokens": 12, "at_step": 0},
        {"prompt_ids": draw(1), "max_tokens": 8, "at_step": 0},
        {"prompt_ids": draw(17), "max_tokens": 10, "at_step": 3},
        {"prompt_ids": draw(5), "max_tokens": 6, "at_step": 6},
        {"prompt_ids": draw(40), "max_tokens": 8, "at_step": 6},
    ]


def schedule_for(group, name, model, single_model, vocab, key):
    rows = schedule_rows(name, vocab)
    s = mg.run_schedule(model, rows, SCHEDULE_PREFILL_STEP)
    settle()
    single = mg.run_schedule(single_model, rows, SCHEDULE_PREFILL_STEP)
    flat = [float(t) for r in s["rows"] for t in r["tokens"]]
    assert same_on_every_rank(group, flat), f"{name}: ranks disagree on the {key} schedule"
    for r, w in zip(s["rows"], single["rows"]):
        r[f"{key}_equals_single"] = r["tokens"] == w["tokens"]
    del s["events"]  # the rows' tokens and steps are what the engine replays
    return s


def main():
    if "MLX_RANK" not in os.environ:
        relaunch()
    mx.set_default_device(mx.cpu)
    group = mx.distributed.init(strict=True, backend="ring")
    assert group.size() == WORLD, group.size()
    doc = {
        "world_size": WORLD,
        "backend": "ring",
        "mlx_version": mx.__version__,
        "mlx_lm_version": mg.mlx_lm.__version__,
        "note": (
            "Per model: tp = mlx-lm's Model.shard(group) on 2 ring ranks (localhost CPU), "
            "single = the same model unsharded in the same process. Each case: greedy "
            "generate_step (make_goldens.single_greedy: prompt[:-1] prefilled in chunks of "
            "<= prefill_step_size, EOS ignored), tokens and the first step's logits (float32). "
            "Every rank produced the same tp tokens and logits. tp_equals_single: tokens equal; "
            "tp_logits_bit_equal_single: first logits equal bit for bit; "
            "tp_max_abs_logit_diff: their largest difference. pipeline (where mlx-lm has a "
            "pipeline split): the same cases with model.model.pipeline(group), pipeline_* "
            "likewise. tp_schedule / pipeline_schedule (some models): make_goldens.run_schedule "
            "(BatchGenerator, greedy, prefill_step_size 8; its events left out) on the sharded / "
            "pipelined model; *_equals_single: a row's tokens equal the unsharded model's run "
            "of the same schedule. Models without tp (qwen3_next, qwen3_5): pipelined only."
        ),
        "models": {},
    }
    for name in MODELS + PIPELINE_ONLY_MODELS:
        model_dir = mg.MODELS_DIR / name
        whole, config = lm_utils.load_model(model_dir)
        mx.eval(whole.parameters())
        # qwen3_5 keeps its text model's settings under text_config.
        config = {**config.get("text_config", {}), **config}
        single = cases_for(name, whole, config["vocab_size"])
        doc["models"][name] = {"model_dir": f"goldens/models/{name}"}
        if name not in PIPELINE_ONLY_MODELS:
            sharded, _ = lm_utils.load_model(model_dir)
            sharded.shard(group)
            mx.eval(sharded.parameters())
            tp = cases_for(name, sharded, config["vocab_size"])
            check_ranks_agree(group, name, tp)
            compare(tp, single, "tp")
            doc["models"][name]["tp"] = tp
            if name in SCHEDULE_MODELS:
                doc["models"][name]["tp_schedule"] = schedule_for(group, name, sharded, whole, config["vocab_size"], "tp")
            if group.rank() == 0:
                eq = sum(c["tp_equals_single"] for c in tp)
                print(f"[distributed goldens] {name}: tp tokens == 1-rank tokens in {eq}/{len(tp)} cases", flush=True)
        if name in PIPELINE_MODELS:
            piped, _ = lm_utils.load_model(model_dir)
            piped.model.pipeline(group)
            mx.eval(piped.parameters())
            pp = cases_for(name, piped, config["vocab_size"])
            check_ranks_agree(group, name, pp)
            compare(pp, single, "pipeline")
            doc["models"][name]["pipeline"] = pp
            if name in SCHEDULE_MODELS:
                doc["models"][name]["pipeline_schedule"] = schedule_for(
                    group, name, piped, whole, config["vocab_size"], "pipeline")
            if group.rank() == 0:
                eq = sum(c["pipeline_logits_bit_equal_single"] for c in pp)
                print(f"[distributed goldens] {name}: pipeline logits == 1-rank bit for bit in {eq}/{len(pp)} cases", flush=True)
    if group.rank() == 0:
        mg.write_json(HERE / "distributed.json", doc)
        print("[distributed goldens] wrote goldens/distributed.json", flush=True)


if __name__ == "__main__":
    main()
