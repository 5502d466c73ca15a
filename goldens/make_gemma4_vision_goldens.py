#!/usr/bin/env python3
"""Gemma 4 vision goldens from mlx-vlm (the SECOND pinned venv: mlx 0.32.4 / mlx-vlm 0.7.10,
numpy 2.4.6, pillow 13.0.0 -- mlx-vlm 0.7.10 needs mlx >= 0.32.4).

Usage (from the repo root):
    /work/vlm-venv/bin/python goldens/make_gemma4_vision_goldens.py

Writes (deterministic, a few seconds):
    goldens/models/gemma4-vision/   tiny random-weight `gemma4` VLM: the text model of
                                    models/gemma4_text (its weights as is, under
                                    `language_model.model.*`; text_config gains
                                    use_bidirectional_attention "vision") + a Gemma 4 vision
                                    tower made with mlx-vlm's own classes (hidden 32, 2 layers,
                                    2 heads of 16, patch 4, pooling 2, clipped linears,
                                    standardize) + embed_vision; float32, mlx-vlm layout;
                                    processor_config.json (max_soft_tokens 16), a word-level
                                    tokenizer whose specials are Gemma 4's image tokens
    goldens/vision/d.png            a 32x32 image (needs no resize); a/b/c.png are Gemma 3's
    goldens/vision/gemma4.safetensors  per image: pixel values (processor output, [3, H, W]),
                                    soft tokens (tower + embed_vision); per case: first-step
                                    logits as Weft computes them and as generate_step does
    goldens/gemma4_vision.json      prompts, greedy trajectories, margins (mlx-vlm generate_step)

Reference facts these goldens pin (mlx-vlm models/gemma4):
- Gemma4ImageProcessor: PIL convert("RGB") (alpha DROPPED, not composited), an aspect-ratio
  preserving bicubic resize to the largest size with at most max_soft_tokens * pooling^2
  patches and sides multiple of pooling * patch (no resize when already that size),
  x.astype(float32) * (1/255) in float32, no normalisation; soft tokens per image
  = (H / patch) * (W / patch) / pooling^2, so prompts hold boi + image x n + eoi per image;
- the tower: patches 2 * (x - 0.5) -> input_proj, + x/y position tables, encoder blocks with
  q/k/v RMS norms and 2-D RoPE (theta 100), SDPA scale 1 with head_dim zero-padded to a fused
  size, pooling by patch position (average over pooling^2), * sqrt(hidden), standardize;
  embed_vision: scale-free RMS norm then a projection; soft tokens replace the SCALED token
  embeddings, and image positions read id 0 from the per-layer-input table;
- with text_config.use_bidirectional_attention == "vision", generate_step passes
  mm_token_type_ids (1 at image tokens): the prompt is prefilled in ONE forward (chunking off)
  and every layer's mask is causal (windowed on sliding layers) OR "same image span".
No reference batches image rows with text rows, so batched Weft runs are gated by equality
with these single-sequence trajectories.
"""

import json
import math
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten
from PIL import Image

import mlx_vlm

HERE = Path(__file__).resolve().parent
TEXT_DIR = HERE / "models" / "gemma4_text"
MODEL_DIR = HERE / "models" / "gemma4-vision"
VISION_DIR = HERE / "vision"

IMAGE, BOI, EOI = 250, 251, 252
VISION_CONFIG = dict(
    model_type="gemma4_vision",
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=16,
    global_head_dim=16,
    rms_norm_eps=1e-6,
    patch_size=4,
    position_embedding_size=32,
    pooling_kernel_size=2,
    default_output_length=16,
    use_clipped_linears=True,
    standardize=True,
    rope_parameters={"rope_theta": 100.0, "rope_type": "default"},
)
PROCESSOR = {"image_processor": {"image_processor_type": "Gemma4ImageProcessor", "patch_size": 4,
                                 "max_soft_tokens": 16, "pooling_kernel_size": 2, "resample": 3,
                                 "rescale_factor": 1 / 255, "do_normalize": False,
                                 "do_convert_rgb": True}}


def randomize(module, rng):
    """Seeded weights (mlx-vlm's init leaves norms at one, clip bounds at +-inf, tables at one)."""
    out = {}
    for k, v in sorted(dict(tree_flatten(module.parameters())).items()):
        leaf = k.split(".")[-1]
        if leaf in ("input_min", "output_min"):
            out[k] = mx.array(-2.0 * float(rng.uniform(0.8, 1.2)), dtype=mx.float32)
        elif leaf in ("input_max", "output_max"):
            out[k] = mx.array(2.0 * float(rng.uniform(0.8, 1.2)), dtype=mx.float32)
        elif ("norm" in k and leaf == "weight") or leaf == "std_scale":
            out[k] = mx.array(rng.uniform(0.5, 1.5, v.shape).astype(np.float32))
        elif leaf in ("std_bias", "position_embedding_table"):
            out[k] = mx.array((rng.standard_normal(v.shape) * 0.5).astype(np.float32))
        else:
            fan_in = int(v.shape[-1]) if v.ndim > 1 else int(v.shape[0])
            out[k] = mx.array((rng.standard_normal(v.shape) / math.sqrt(fan_in)).astype(np.float32))
    module.update(tree_unflatten(list(out.items())))
    return out


def write_tokenizer():
    """Word-level: "t<id>" for ids < 250, Gemma 4's image specials, pieces split on spaces."""
    vocab = {f"t{i}": i for i in range(250)}
    special = {"<|image|>": IMAGE, "<|image>": BOI, "<image|>": EOI}
    vocab.update(special)
    vocab.update({f"t{i}": i for i in range(253, 256)})
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for c, i in special.items()],
        "normalizer": None,
        "pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "Removed", "invert": False},
        "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": dict(sorted(vocab.items(), key=lambda kv: kv[1])), "unk_token": "t0"},
    }
    (MODEL_DIR / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False) + "\n")
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    (MODEL_DIR / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}) + "\n")
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))


def build():
    from mlx_vlm.models.gemma4.config import ModelConfig, TextConfig, VisionConfig
    from mlx_vlm.models.gemma4.gemma4 import Model
    from mlx_vlm.utils import load_model

    text_cfg = json.loads((TEXT_DIR / "config.json").read_text())
    text_cfg["use_bidirectional_attention"] = "vision"
    config = {
        "model_type": "gemma4",
        "architectures": ["Gemma4ForConditionalGeneration"],
        "text_config": text_cfg,
        "vision_config": VISION_CONFIG,
        "vocab_size": text_cfg["vocab_size"],
        "hidden_size": text_cfg["hidden_size"],
        "image_token_id": IMAGE, "boi_token_id": BOI, "eoi_token_id": EOI,
        "audio_token_id": 253, "boa_token_id": 254, "eoa_token_id": 255,
        "vision_soft_tokens_per_image": 16,
        "eos_token_id": 1,
        "torch_dtype": "float32",
    }
    mc = ModelConfig.from_dict(config)
    mc.text_config = TextConfig.from_dict(text_cfg)
    mc.vision_config = VisionConfig.from_dict(VISION_CONFIG)
    model = Model(mc)
    rng = np.random.default_rng(20261201)
    tower = {f"vision_tower.{k}": v for k, v in randomize(model.vision_tower, rng).items()}
    embed = {f"embed_vision.{k}": v for k, v in randomize(model.embed_vision, rng).items()}
    text = {f"language_model.{k}": v for k, v in mx.load(str(TEXT_DIR / "model.safetensors")).items()}
    weights = {**text, **tower, **embed}
    if MODEL_DIR.exists():
        shutil.rmtree(MODEL_DIR)
    MODEL_DIR.mkdir(parents=True)
    mx.save_safetensors(str(MODEL_DIR / "model.safetensors"), weights, metadata={"format": "mlx"})
    (MODEL_DIR / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (MODEL_DIR / "processor_config.json").write_text(json.dumps(PROCESSOR, indent=2) + "\n")
    loaded = load_model(MODEL_DIR)
    got = dict(tree_flatten(loaded.parameters()))
    for k, v in weights.items():
        assert k in got and mx.array_equal(got[k], v).item(), k
    return loaded


def pixel_values(im):
    from mlx_vlm.models.gemma4.processing_gemma4 import Gemma4ImageProcessor

    proc = Gemma4ImageProcessor(**{k: v for k, v in PROCESSOR["image_processor"].items()
                                   if k != "image_processor_type"})
    data, n = proc([im])
    return mx.array(np.asarray(data["pixel_values"][0], dtype=np.float32)), n[0]


def greedy(model, ids, pixels, max_tokens):
    """mlx-vlm generate_step, greedy, with the processor's mm_token_type_ids."""
    from mlx_vlm.generate.ar import generate_step

    input_ids = mx.array([ids], dtype=mx.int32)
    types = (input_ids == IMAGE).astype(mx.int32)
    tokens, margins, first = [], [], None
    for n, (tok, logprobs) in enumerate(generate_step(
            input_ids, model, pixels, None, max_tokens=max_tokens,
            sampler=lambda lp: mx.argmax(lp, axis=-1), mm_token_type_ids=types)):
        if n == 0:
            first = logprobs
        v = np.array(logprobs.astype(mx.float32)).reshape(-1).astype(np.float64)
        i = int(np.argmax(v))
        margins.append(float(np.float32(v[i] - np.max(np.delete(v, i)))))
        tokens.append(int(tok))
    return tokens, margins, first


def first_logits(model, ids, pixels, split):
    """The first step's logits: the whole prompt in one forward (generate_step's way with
    bidirectional image spans), or prompt[:-1] then the last token (the engine's schedule)."""
    input_ids = mx.array([ids], dtype=mx.int32)
    types = (input_ids == IMAGE).astype(mx.int32)
    emb = model.get_input_embeddings(input_ids, pixels)
    h, pli = emb.inputs_embeds, emb.per_layer_inputs
    lm = model.language_model
    cache = lm.make_cache()
    if split:
        lm(input_ids[:, :-1], inputs_embeds=h[:, :-1], per_layer_inputs=pli[:, :-1],
           mm_token_type_ids=types[:, :-1], cache=cache)
        out = lm(input_ids[:, -1:], inputs_embeds=h[:, -1:], per_layer_inputs=pli[:, -1:], cache=cache)
    else:
        out = lm(input_ids, inputs_embeds=h, per_layer_inputs=pli, mm_token_type_ids=types, cache=cache,
                 logits_to_keep=1)
    return out.logits[0, -1, :]


def main():
    mx.set_default_device(mx.cpu)
    d = np.random.RandomState(11).randint(0, 256, (32, 32, 3)).astype(np.uint8)
    Image.fromarray(d, "RGB").save(VISION_DIR / "d.png", optimize=True)
    images = {n: Image.open(VISION_DIR / f"{n}.png") for n in "abcd"}
    model = build()
    tokenizer = write_tokenizer()
    tensors, counts = {}, {}
    doc = {
        "model_dir": "goldens/models/gemma4-vision",
        "mlx_version": mx.__version__, "mlx_vlm_version": mlx_vlm.__version__,
        "numpy_version": np.__version__, "pillow_version": Image.__version__,
        "image_token_id": IMAGE, "boi_token_id": BOI, "eoi_token_id": EOI,
        "processor": PROCESSOR["image_processor"],
        "note": "pixels/<image> ([3, H, W]) and soft/<image> (tower + embed_vision, [n, 64]) in "
                "vision/gemma4.safetensors; first_logits/<case> (prompt[:-1] then the last token, "
                "the engine's schedule) and whole_logits/<case> (one forward, generate_step's). "
                "Tokens: mlx-vlm generate_step greedy with mm_token_type_ids, EOS ignored.",
        "images": {}, "cases": [],
    }
    pixels = {}
    for name, im in images.items():
        px, n = pixel_values(im)
        soft = model.encode_image(px[None])
        assert soft.shape == (1, n, 64), soft.shape
        tensors[f"pixels/{name}"] = px
        tensors[f"soft/{name}"] = soft[0]
        pixels[name], counts[name] = px, n
        doc["images"][name] = {"file": f"goldens/vision/{name}.png", "mode": im.mode,
                               "size": list(im.size), "pixels": list(px.shape), "soft_tokens": n}
    # Two same-size images go through the tower as one batch (mlx-vlm stacks them): equal.
    pair = model.encode_image(mx.stack([pixels["a"], pixels["b"]]))
    assert mx.array_equal(pair[0], mx.concatenate([tensors["soft/a"], tensors["soft/b"]])).item()

    def span(name):
        return [BOI] + [IMAGE] * counts[name] + [EOI]

    pre, post = [2, 17, 93], [44, 0, 201, 12, 77, 150, 5, 33]
    cases = [
        ("image_a", pre + span("a") + post, ["a"]),
        ("image_b", pre + span("b") + post, ["b"]),
        ("image_c", pre + span("c") + post, ["c"]),
        ("image_d", pre + span("d") + post, ["d"]),
        ("two_images", [2, 40] + span("a") + [61] + span("c") + [9, 0, 150, 88], ["a", "c"]),
        ("text", pre + [200, 201, 202, 0, 203] + post, []),
    ]
    for key, ids, imgs in cases:
        if not imgs:
            px = None
        elif len({tuple(pixels[i].shape) for i in imgs}) == 1:
            px = mx.stack([pixels[i] for i in imgs])
        else:
            px = [pixels[i][None] for i in imgs]
        toks, margins, first = greedy(model, ids, px, 20)
        # Without image tokens generate_step prefills chunked (prompt[:-1], then the last).
        whole = first_logits(model, ids, px, split=not imgs)
        w2 = whole[None]
        lp = (w2 - mx.logsumexp(w2, axis=-1, keepdims=True))[0]
        assert mx.array_equal(lp, first.reshape(-1)).item(), ("not generate_step's first step", mx.abs(lp - first.reshape(-1)).max())
        split = first_logits(model, ids, px, split=True)
        assert int(mx.argmax(split).item()) == toks[0]
        tensors[f"first_logits/{key}"] = split
        tensors[f"whole_logits/{key}"] = whole
        doc["cases"].append({"name": key, "prompt_ids": ids, "images": imgs, "tokens": toks,
                             "margins": margins,
                             "split_vs_whole_max_abs": float(mx.abs(split - whole).max())})
    # Causal attention over the image (no mm_token_type_ids) changes the trajectory: the
    # bidirectional spans are exercised.
    from mlx_vlm.generate.ar import generate_step

    causal = [int(t) for t, _ in generate_step(mx.array([cases[0][1]]), model, pixels["a"][None], None,
                                               max_tokens=20, sampler=lambda lp: mx.argmax(lp, axis=-1))]
    doc["image_a_causal_tokens"] = causal
    by = {c["name"]: c["tokens"] for c in doc["cases"]}
    assert causal != by["image_a"], "bidirectional image attention must matter"
    assert len({tuple(by[n]) for n in ("image_a", "image_b", "image_c", "image_d")}) == 4
    # A text prompt with one <|image|> per image: the processor's expansion, tokenized.
    text = "t2 t17 t93 <|image|> t44 t0 t201 t12 t77 t150 t5 t33"
    expanded = text.replace("<|image|>", "<|image>" + "<|image|>" * counts["a"] + "<image|>")
    assert tokenizer.encode(expanded).ids == cases[0][1], tokenizer.encode(expanded).ids
    doc["text_prompt"] = {"text": text, "images": ["a"], "equals_case": "image_a"}
    mx.save_safetensors(str(VISION_DIR / "gemma4.safetensors"), tensors, metadata={"format": "mlx"})
    (HERE / "gemma4_vision.json").write_text(json.dumps(doc, indent=1) + "\n")
    for c in doc["cases"]:
        print(c["name"], c["tokens"], round(min(c["margins"]), 4), c["split_vs_whole_max_abs"])
    print("causal image_a", causal, "counts", counts)


if __name__ == "__main__":
    main()
