"""Weft parity goldens for the hybrid gated-DeltaNet models (qwen3_next, qwen3_5).

Usage (from the repo root):
    .venv/bin/python goldens/make_gdn_goldens.py [--only qwen3_next|qwen3_5]

Builds tiny random-weight models with mlx-lm's own classes (goldens/models/<name>/), then
records, with the helpers of make_goldens.py (same JSON schema as goldens/llama-fp32.json):
single greedy trajectories + first-step logits (incl. a chunked prefill), batch_generate
B=2 / B=4 and BatchGenerator continuous schedules, and two bursts (`burst`, `burst_chunked`):
ten rows of different lengths inserted into one BatchGenerator at once, prefilled together in
right-padded chunks (prefill_step_size 2048 and 8), with each row's first-step logprobs from
the batched run. Every batched row also carries
`single_tokens`: mlx-lm's single-sequence greedy trajectory for that prompt (generate_step),
so a row whose batched tokens differ (equals_single false) can still be checked against the
single-sequence oracle. Deterministic: re-running rewrites byte-identical files.
"""

import argparse
import contextlib
import math
import shutil
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map_with_path

import mlx_lm.utils as lm_utils
from mlx_lm.generate import BatchGenerator

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_goldens as mg  # noqa: E402

GDN_MODELS = {
    # qwen3_next: layers 0-2 gated DeltaNet, layer 3 full attention (full_attention_interval 4);
    # MoE (4 experts, top-2, normalized, shared expert with sigmoid gate) on layers 0, 1, 3;
    # layer 2 is a dense MLP (mlp_only_layers). Attention: q_proj doubled (output gate), q/k
    # RMSNorm, partial RoPE (a quarter of head_dim 32 = 8 dims).
    "qwen3_next": dict(
        seed=2001,
        dtype="float32",
        config=mg._base_config(
            "qwen3_next", "Qwen3NextForCausalLM",
            hidden_size=64, num_hidden_layers=4, intermediate_size=128,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32,
            linear_num_value_heads=4, linear_num_key_heads=2,
            linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
            num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1,
            shared_expert_intermediate_size=64, moe_intermediate_size=32,
            mlp_only_layers=[2], norm_topk_prob=True,
            rms_norm_eps=1e-6, vocab_size=512, rope_theta=1000000.0,
            partial_rotary_factor=0.25, max_position_embeddings=4096,
            full_attention_interval=4, tie_word_embeddings=False,
            bos_token_id=None, eos_token_id=3, torch_dtype="float32",
        ),
        scales=dict(embed=8.0, qk=3.0, lm_head=12.0),
        gdn_scales=dict(in_proj=3.0, conv=2.0, out_proj=2.0),
        batch=True,
    ),
    # qwen3_5 (dense hybrid): nested text_config as the HF checkpoints have it; layers 0 and 2
    # gated DeltaNet, 1 and 3 full attention (full_attention_interval 2); tied embeddings;
    # rope from rope_parameters (partial_rotary_factor 0.25, mrope_section ignored for text).
    "qwen3_5": dict(
        seed=2002,
        dtype="float32",
        config={
            "model_type": "qwen3_5",
            "architectures": ["Qwen3_5ForConditionalGeneration"],
            "tie_word_embeddings": True,
            "eos_token_id": 5,
            "text_config": dict(
                model_type="qwen3_5_text",
                hidden_size=64, num_hidden_layers=4, intermediate_size=160,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                linear_num_value_heads=4, linear_num_key_heads=2,
                linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
                rms_norm_eps=1e-6, vocab_size=512, max_position_embeddings=4096,
                full_attention_interval=2, tie_word_embeddings=True,
                rope_parameters={
                    "rope_type": "default", "rope_theta": 100000.0,
                    "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1],
                },
                eos_token_id=5,
            ),
        },
        scales=dict(embed=4.0, qk=3.0, vo=4.0, mlp=4.0),
        gdn_scales=dict(in_proj=3.0, conv=2.0, out_proj=4.0),
        batch=True,
    ),
}

# qwen3_5 affine-quantized as mlx_lm.convert does by default (4 bits, group 64; layers whose
# input width is not a multiple of 64, here mlp.down_proj (160), stay float). Float parts
# float32.
GDN_MODELS["qwen3_5-4bit"] = dict(
    GDN_MODELS["qwen3_5"], seed=2004, quantize=dict(group_size=64, bits=4),
)

# qwen3_5_moe: the qwen3_5 stack with a shared-expert MoE on every layer (mlx-lm builds it
# from qwen3_5's classes; norm_topk_prob defaults to true there). Float32.
GDN_MODELS["qwen3_5_moe"] = dict(
    GDN_MODELS["qwen3_5"], seed=2005,
    config=dict(
        GDN_MODELS["qwen3_5"]["config"], model_type="qwen3_5_moe",
        architectures=["Qwen3_5MoeForConditionalGeneration"], tie_word_embeddings=False,
        text_config=dict(
            GDN_MODELS["qwen3_5"]["config"]["text_config"], model_type="qwen3_5_moe_text",
            tie_word_embeddings=False, num_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=32, shared_expert_intermediate_size=64,
            rope_parameters=dict(GDN_MODELS["qwen3_5"]["config"]["text_config"]["rope_parameters"]),
        ),
    ),
    scales=dict(embed=8.0, qk=3.0, lm_head=12.0),
)

# Quantized experts (SwitchGLU -> QuantizedSwitchLinear -> gather_qmm): qwen3_next and
# qwen3_5_moe at 4 bits g64 with the router (mlp.gate) and shared_expert_gate at 8 bits (the
# models' own quant_predicate); moe_intermediate_size 64 so every expert projection quantizes.
# mlx-lm's own QuantizedSwitchLinear (gather_qmm with global_scale=None: MLX >= 0.32.3).
GDN_MODELS["qwen3_next-4bit"] = dict(
    GDN_MODELS["qwen3_next"], seed=2006, quantize=dict(group_size=64, bits=4),
    config=dict(GDN_MODELS["qwen3_next"]["config"], moe_intermediate_size=64),
)
GDN_MODELS["qwen3_5_moe-4bit"] = dict(
    GDN_MODELS["qwen3_5_moe"], seed=2007, quantize=dict(group_size=64, bits=4),
    config=dict(
        GDN_MODELS["qwen3_5_moe"]["config"],
        text_config=dict(GDN_MODELS["qwen3_5_moe"]["config"]["text_config"], moe_intermediate_size=64),
    ),
)

# qwen3_5 in bfloat16 the way mlx_lm.convert casts it: every float tensor except those the
# model's cast_predicate keeps (A_log stays float32). (A bfloat16 qwen3_next cannot run on
# CPU: MLX's CPU gather_mm, which its experts use, is float32-only.)
GDN_MODELS["qwen3_5-bf16"] = dict(
    GDN_MODELS["qwen3_5"], seed=2003, dtype="bfloat16",
    config=dict(GDN_MODELS["qwen3_5"]["config"], torch_dtype="bfloat16"),
)


def _rescale_gdn(model, scales):
    """Sharper gated-DeltaNet layers (default init makes them nearly inert): in_proj_* and
    out_proj weights, conv1d kernels scaled; A_log / dt_bias kept as mlx-lm initializes them."""

    def f(path, w):
        if ".linear_attn.in_proj" in path:
            return w * scales["in_proj"]
        if path.endswith("linear_attn.conv1d.weight"):
            return w * scales["conv"]
        if path.endswith("linear_attn.out_proj.weight"):
            return w * scales["out_proj"]
        if path.endswith("lm_head.weight") and path != "lm_head.weight":
            return w * 12.0
        return w

    model.update(tree_map_with_path(f, model.parameters()))
    mx.eval(model.parameters())


@contextlib.contextmanager
def _conv1d_init_of_mlx_0_32_2():
    """nn.Conv1d's constructor as in MLX 0.32.2, whose init scale is sqrt(1 / (in_channels *
    kernel)); 0.32.3 divides in_channels by groups, which multiplies the depthwise
    linear_attn.conv1d kernels by sqrt(conv_dim). The committed models were drawn on 0.32.2 and
    MLX's forward ops give the same bits on both versions, so keeping the old draw keeps every
    model and golden here unchanged (goldens/README.md, "The move from MLX 0.32.2 to 0.32.4")."""
    original = nn.Conv1d.__init__

    def init(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
             groups=1, bias=True):
        nn.Module.__init__(self)
        scale = math.sqrt(1 / (in_channels * kernel_size))
        self.weight = mx.random.uniform(
            low=-scale, high=scale, shape=(out_channels, kernel_size, in_channels // groups))
        if bias:
            self.bias = mx.zeros((out_channels,))
        self.padding = padding
        self.dilation = dilation
        self.stride = stride
        self.groups = groups

    nn.Conv1d.__init__ = init
    try:
        yield
    finally:
        nn.Conv1d.__init__ = original


def build(name):
    spec = GDN_MODELS[name]
    cfg = dict(spec["config"])
    cfg = {k: v for k, v in cfg.items() if v is not None}
    model_class, args_class = lm_utils._get_classes(cfg)
    mx.random.seed(spec["seed"])
    with _conv1d_init_of_mlx_0_32_2():
        model = model_class(args_class.from_dict(cfg))
    mg._rescale(model, spec["scales"])
    _rescale_gdn(model, spec["gdn_scales"])
    if spec["dtype"] == "bfloat16":
        keep = getattr(model, "cast_predicate", lambda _: True)
        model.update(tree_map_with_path(
            lambda p, w: w.astype(mx.bfloat16) if keep(p) and mx.issubdtype(w.dtype, mx.floating) else w,
            model.parameters()))
    else:
        assert spec["dtype"] == "float32"
    if "quantize" in spec:
        q = spec["quantize"]
        model, cfg = lm_utils.quantize_model(model, cfg, group_size=q["group_size"], bits=q["bits"], mode="affine")
    mx.eval(model.parameters())

    out = mg.MODELS_DIR / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    lm_utils.save_model(out, model)
    lm_utils.save_config(cfg, config_path=out / "config.json")

    loaded, loaded_cfg = lm_utils.load_model(out)
    a = dict(tree_flatten(model.parameters()))
    b = dict(tree_flatten(loaded.parameters()))
    assert a.keys() == b.keys(), (name, set(a) ^ set(b))
    for k in a:
        assert a[k].dtype == b[k].dtype and mx.array_equal(a[k], b[k]).item(), (name, k)
    return loaded, loaded_cfg


def single_tokens(model, prompt, n, memo):
    key = (tuple(prompt), n)
    if key not in memo:
        r, _ = mg.single_greedy(model, prompt, n)
        memo[key] = r["tokens"]
    return memo[key]


BURST_NOTE = (
    "Ten rows inserted together into BatchGenerator(model, stop_tokens=[], prefill_step_size=P) "
    "(default prefill_batch_size 8, completion_batch_size 32), then next() until every row has "
    "max_tokens tokens: mlx-lm prefills up to 8 rows at a time in right-padded chunks of <= P "
    "tokens per row (ArraysCache masks the padding out of the recurrent layers). tokens = the "
    "row's greedy tokens; first_logprobs = the logprobs row returned with its first token "
    "(float32 values, computed in the batch); single_tokens / first_logprobs_equal_single: the "
    "row's prompt alone through generate_step with the same prefill_step_size."
)
BURST_LENS = [3, 26, 1, 11, 40, 17, 6, 33, 9, 2]
BURST_MAX_TOKENS = [10, 8, 12, 6, 8, 10, 9, 7, 11, 8]


def run_burst(model, prompts, max_tokens, prefill_step_size):
    """Every prompt inserted at once; greedy tokens and first-step logprobs per row."""
    gen = BatchGenerator(model, stop_tokens=[], prefill_step_size=prefill_step_size)
    uids = gen.insert(prompts, max_tokens)
    toks = {u: [] for u in uids}
    first_lp = {}
    steps = 0
    while len(first_lp) < len(uids) or any(len(toks[u]) < m for u, m in zip(uids, max_tokens)):
        _, gen_resps = gen.next()
        for r in gen_resps:
            if r.uid not in first_lp:
                first_lp[r.uid] = mg.f32_list(r.logprobs)
            toks[r.uid].append(int(r.token))
        steps += 1
        assert steps < 1000
    gen.close()
    return [toks[u] for u in uids], [first_lp[u] for u in uids]


def bursts(name, model, vocab):
    draw = mg.prompt_pool(f"{name}/burst", vocab)
    prompts = [draw(L) for L in BURST_LENS]
    out = {}
    for key, pss in (("burst", 2048), ("burst_chunked", 8)):
        tokens, first_lp = run_burst(model, prompts, BURST_MAX_TOKENS, pss)
        rows = []
        for i, (p, m, t, lp) in enumerate(zip(prompts, BURST_MAX_TOKENS, tokens, first_lp)):
            assert len(t) == m
            single, _ = mg.single_greedy(model, p, m, prefill_step_size=pss)
            rows.append({
                "id": i, "prompt_ids": p, "max_tokens": m, "at_step": 0, "tokens": t,
                "first_logprobs": lp, "single_tokens": single["tokens"],
                "equals_single": t == single["tokens"],
                "first_logprobs_equal_single": lp == single["first_logprobs"],
            })
        out[key] = {"prefill_step_size": pss, "rows": rows}
    return out


def goldens(name):
    model, config = build(name)
    mg.TINY_MODELS[name] = GDN_MODELS[name]  # goldens_tiny reads the "batch" flag there
    # goldens_tiny reads vocab_size at the top level; qwen3_5 nests it in text_config.
    flat = {**config, **config.get("text_config", {})}
    doc = mg.goldens_tiny(name, model, flat)
    doc["config"] = {k: v for k, v in config.items() if k not in ("architectures",)}
    memo = {}
    for batch in doc["batch"]:
        for r in batch["rows"]:
            r["single_tokens"] = single_tokens(model, r["prompt_ids"], r["max_tokens"], memo)
    for key in ("schedule", "schedule_chunked"):
        for r in doc[key]["rows"]:
            r["single_tokens"] = single_tokens(model, r["prompt_ids"], r["max_tokens"], memo)
    doc["note_burst"] = BURST_NOTE
    doc.update(bursts(name, model, flat["vocab_size"]))
    doc["note_gdn"] = (
        "single_tokens (batch and schedule rows) = generate_step greedy tokens for the row's "
        "prompt alone (max_tokens of the row); equals_single = (tokens == single_tokens). "
        "Weft prefills rows together as mlx-lm does (padding masked out of the recurrent "
        "layers) and is checked against tokens where equals_single holds and single_tokens "
        "otherwise."
    )
    return doc


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", action="append", default=[], help=", ".join(GDN_MODELS))
    args = ap.parse_args()
    names = args.only or list(GDN_MODELS)
    for n in names:
        if n not in GDN_MODELS:
            ap.error(f"unknown model {n}")
    mx.set_default_device(mx.cpu)
    for name in names:
        print(f"[gdn-goldens] {name}", flush=True)
        doc = goldens(name)
        mg.write_json(mg.HERE / f"{name}.json", doc)
        print(f"[gdn-goldens] wrote goldens/{name}.json", flush=True)


if __name__ == "__main__":
    main()
