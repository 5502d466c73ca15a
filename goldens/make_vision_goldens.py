#!/usr/bin/env python3
"""Gemma 3 vision goldens from mlx-vlm (a SECOND pinned venv: mlx 0.32.4 / mlx-vlm 0.7.10,
transformers 5.24.0, pillow 13.0.0 -- mlx-vlm 0.7.10 needs mlx >= 0.32.4, newer than the
mlx 0.32.2 the text goldens pin).

Usage (from the repo root):
    /work/vlm-venv/bin/python goldens/make_vision_goldens.py              # writes the goldens
    /work/vlm-venv/bin/python goldens/make_vision_goldens.py --check-text # mlx 0.32.4 vs the
        # mlx 0.32.2 text goldens: runs goldens/gemma3.json's single cases through this venv's
        # mlx with mlx-lm's gemma3_text source taken from the main .venv (pure Python)

Writes (deterministic, a few seconds):
    goldens/models/gemma3-vision/   tiny random-weight `gemma3` VLM made with mlx-vlm's own
                                    classes (SigLIP tower 2 layers, 32 px / patch 8 = 16 patches,
                                    pooled 2x2 -> 4 soft tokens per image; text model 4 layers,
                                    window 8, pattern 2), mlx-vlm layout, float32, tied lm_head
    goldens/vision/*.png            the test images (generated here)
    goldens/vision/gemma3.safetensors  pixel values (processor output), image features (tower
                                    + projector), first-step logits, per case
    goldens/gemma3_vision.json      prompts, greedy trajectories, margins (mlx-vlm generate_step)

Reference facts these goldens pin (mlx-vlm models/gemma3):
- prompt ids hold `image_token_index` once per soft token (the processor expands each
  `<start_of_image>` to "\\n\\n" boi + image x mm_tokens_per_image + eoi "\\n\\n");
- image features are divided by sqrt(top-level config hidden_size) before the text model's
  embedding scale; in a prompt with an image every token equal to `pad_token_id` embeds as 0;
- generate_step passes no mask: attention stays causal over the image span (the 4-D mask
  get_input_embeddings returns is not used by the gemma3 text model in generation);
- SigLIP post_layernorm has eps 1e-5 (nn.LayerNorm default), encoder norms layer_norm_eps.
Pixel values: transformers' Gemma3ImageProcessorPil (the use_fast=False processor mlx-vlm
loads): convert_rgb (alpha composited on white), PIL bilinear resize to the square size,
x/255 in float64 then float32, (x - 0.5) / 0.5.
No reference batches image rows with text rows (mlx-vlm's batch path does not take
per-row images mixed with text rows in one schedule), so batched Weft runs are gated by
equality with these single-sequence trajectories.
"""

import argparse
import json
import shutil
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_map_with_path
from PIL import Image

HERE = Path(__file__).resolve().parent
MODEL_DIR = HERE / "models" / "gemma3-vision"
VISION_DIR = HERE / "vision"
SEED = 1701

IMAGE_TOKEN = 511
BOI = 509
EOI = 510
PAD = 0
TEXT_CONFIG = {
    "model_type": "gemma3_text",
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "intermediate_size": 64,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "rms_norm_eps": 1e-6,
    "vocab_size": 512,
    "rope_local_base_freq": 10000.0,
    "rope_scaling": {"rope_type": "linear", "factor": 2.0},
    "query_pre_attn_scalar": 48,
    "sliding_window": 8,
    "sliding_window_pattern": 2,
    "max_position_embeddings": 4096,
    "mm_tokens_per_image": 4,
}
VISION_CONFIG = {
    "model_type": "siglip_vision_model",
    "num_hidden_layers": 2,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 2,
    "patch_size": 8,
    "image_size": 32,
    "num_channels": 3,
    "layer_norm_eps": 1e-6,
}
CONFIG = {
    "model_type": "gemma3",
    "architectures": ["Gemma3ForConditionalGeneration"],
    "text_config": TEXT_CONFIG,
    "vision_config": VISION_CONFIG,
    "vocab_size": 512,
    "hidden_size": 64,
    "image_token_index": IMAGE_TOKEN,
    "boi_token_index": BOI,
    "eoi_token_index": EOI,
    "pad_token_id": PAD,
    "mm_tokens_per_image": 4,
    "eos_token_id": 1,
    "torch_dtype": "float32",
}
PROCESSOR = {"size": {"height": 32, "width": 32}, "image_mean": [0.5] * 3, "image_std": [0.5] * 3,
             "resample": 2, "rescale_factor": 1 / 255, "do_convert_rgb": True}


def make_images():
    """Three small PNGs: RGB downscaled (non-square), RGB upscaled, RGBA (alpha on white)."""
    VISION_DIR.mkdir(exist_ok=True)
    rng = np.random.RandomState(7)
    h, w = 45, 61
    y, x = np.mgrid[0:h, 0:w]
    a = np.stack([(x * 4) % 256, (y * 5) % 256, ((x + y) * 3) % 256], -1)
    a = np.clip(a + rng.randint(-30, 31, a.shape), 0, 255).astype(np.uint8)
    b = rng.randint(0, 256, (20, 24, 3)).astype(np.uint8)
    c = rng.randint(0, 256, (40, 40, 4)).astype(np.uint8)
    c[..., 3] = np.where(rng.rand(40, 40) < 0.3, 255, c[..., 3])
    c[:4, :4, 3] = 0
    files = {"a.png": Image.fromarray(a, "RGB"), "b.png": Image.fromarray(b, "RGB"),
             "c.png": Image.fromarray(c, "RGBA")}
    for name, im in files.items():
        im.save(VISION_DIR / name, optimize=True)
    return {name: Image.open(VISION_DIR / name) for name in files}


def pixel_values(images):
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    proc = Gemma3ImageProcessorPil(**PROCESSOR)
    out = proc(images, return_tensors="np")
    return mx.array(out["pixel_values"].astype(np.float32))


def build():
    from mlx_vlm.models import gemma3
    from mlx_vlm.utils import load_model

    mx.random.seed(SEED)
    mc = gemma3.ModelConfig.from_dict(CONFIG)
    mc.text_config = gemma3.TextConfig.from_dict(TEXT_CONFIG)
    mc.vision_config = gemma3.VisionConfig.from_dict(VISION_CONFIG)
    model = gemma3.Model(mc)

    def f(path, w):
        if path.endswith("norm.weight") and "language_model" in path:
            return mx.random.uniform(0.5, 1.5, w.shape, dtype=w.dtype)
        if path.endswith("mm_soft_emb_norm.weight"):
            return mx.random.uniform(-0.5, 0.5, w.shape, dtype=w.dtype)
        if path.endswith("mm_input_projection_weight"):
            return mx.random.normal(w.shape, dtype=w.dtype) * 0.2
        if "layer_norm" in path or "post_layernorm" in path:
            if path.endswith("weight"):
                return mx.random.uniform(0.5, 1.5, w.shape, dtype=w.dtype)
            return mx.random.normal(w.shape, dtype=w.dtype) * 0.1
        if path.endswith(("q_proj.weight", "k_proj.weight")) and "language_model" in path:
            return w * 3.0
        if path.endswith(("v_proj.weight", "o_proj.weight", "up_proj.weight", "down_proj.weight")) \
                and "language_model" in path:
            return w * 4.0
        if path.endswith("bias"):
            return mx.random.normal(w.shape, dtype=w.dtype) * 0.1
        return w

    model.update(tree_map_with_path(f, model.parameters()))
    mx.eval(model.parameters())

    if MODEL_DIR.exists():
        shutil.rmtree(MODEL_DIR)
    MODEL_DIR.mkdir(parents=True)
    weights = dict(tree_flatten(model.parameters()))
    # Tied, as the real checkpoints: no lm_head tensor (mlx-vlm's sanitize ties it).
    weights.pop("language_model.lm_head.weight")
    mx.save_safetensors(str(MODEL_DIR / "model.safetensors"), weights, metadata={"format": "mlx"})
    (MODEL_DIR / "config.json").write_text(json.dumps(CONFIG, indent=4) + "\n")

    loaded = load_model(MODEL_DIR)
    a = dict(tree_flatten(model.parameters()))
    b = dict(tree_flatten(loaded.parameters()))
    assert a.keys() == b.keys(), set(a) ^ set(b)
    for k in a:
        want = a["language_model.model.embed_tokens.weight"] if k == "language_model.lm_head.weight" else a[k]
        assert b[k].dtype == want.dtype and mx.array_equal(b[k], want).item(), k
    return loaded


def greedy(model, ids, pixels, max_tokens, prefill_step_size=2048):
    """mlx-vlm generate_step, greedy; returns tokens, margins, first logprobs."""
    from mlx_vlm.generate.ar import generate_step

    input_ids = mx.array([ids], dtype=mx.int32)
    mask = mx.ones_like(input_ids)
    tokens, margins, first = [], [], None
    for n, (tok, logprobs) in enumerate(generate_step(
            input_ids, model, pixels, mask, max_tokens=max_tokens,
            sampler=lambda lp: mx.argmax(lp, axis=-1), prefill_step_size=prefill_step_size)):
        if n == 0:
            first = logprobs
        v = np.array(logprobs.astype(mx.float32)).reshape(-1).astype(np.float64)
        i = int(np.argmax(v))
        margins.append(float(np.float32(v[i] - np.max(np.delete(v, i)))))
        tokens.append(int(tok))
    return tokens, margins, first


def first_logits(model, ids, pixels):
    """The first step's logits the way generate_step computes them: the prompt's embeddings
    (soft tokens spliced) minus the last position prefilled in one chunk, then the last."""
    input_ids = mx.array([ids], dtype=mx.int32)
    emb = model.get_input_embeddings(input_ids, pixels, mask=mx.ones_like(input_ids)).inputs_embeds
    cache = model.language_model.make_cache()
    model.language_model(input_ids[:, :-1], inputs_embeds=emb[:, :-1], cache=cache)
    out = model.language_model(input_ids[:, -1:], inputs_embeds=emb[:, -1:], cache=cache)
    return out.logits[0, -1, :]


def image_span():
    return [BOI] + [IMAGE_TOKEN] * TEXT_CONFIG["mm_tokens_per_image"] + [EOI]


def main():
    mx.set_default_device(mx.cpu)
    images = make_images()
    model = build()
    tensors = {}
    doc = {
        "model_dir": "goldens/models/gemma3-vision",
        "mlx_version": mx.__version__,
        "mlx_vlm_version": __import__("mlx_vlm").__version__,
        "image_token_index": IMAGE_TOKEN, "boi_token_index": BOI, "eoi_token_index": EOI,
        "pad_token_id": PAD, "processor": PROCESSOR,
        "note": "pixels/<image> and features/<image> are in vision/gemma3.safetensors; "
                "first_logits/<case> too. Tokens: mlx-vlm generate_step greedy, EOS ignored.",
        "images": {}, "cases": [],
    }
    for name, im in images.items():
        px = pixel_values([im])
        assert px.shape == (1, 3, 32, 32), px.shape
        hidden, _, _ = model.vision_tower(px.transpose(0, 2, 3, 1), output_hidden_states=True)
        feats = model.multi_modal_projector(hidden)
        stem = name.split(".")[0]
        tensors[f"pixels/{stem}"] = px[0]
        tensors[f"features/{stem}"] = feats[0]
        doc["images"][stem] = {"file": f"goldens/vision/{name}", "mode": im.mode,
                               "size": list(im.size)}

    # A prompt longer than the window with one image mid-way; a pad id (0) in the text
    # (zeroed in image prompts); the same prompt with image b; two images; a text-only row.
    pre = [2, 17, 93, 108]
    post = [108, 44, 0, 301, 12, 77, 250, 5, 33]
    cases = [
        ("image_a", pre + image_span() + post, ["a"]),
        ("image_b", pre + image_span() + post, ["b"]),
        ("image_c", pre + image_span() + post, ["c"]),
        ("two_images", [2, 40] + image_span() + [108, 61] + image_span() + [9, 0, 150, 88], ["a", "b"]),
        ("text", pre + [300, 301, 302, 0, 303] + post, []),
    ]
    for key, ids, imgs in cases:
        px = mx.concatenate([tensors[f"pixels/{i}"][None] for i in imgs]) if imgs else None
        for pss in ((2048, 5) if key in ("image_a", "two_images") else (2048,)):
            toks, margins, first = greedy(model, ids, px, 20, pss)
            name = key if pss == 2048 else f"{key}/chunk{pss}"
            if pss == 2048:
                logits = first_logits(model, ids, px)
                assert int(mx.argmax(logits).item()) == toks[0]
                lp = logits - mx.logsumexp(logits)
                assert mx.array_equal(lp, first.reshape(-1)).item(), "not generate_step's first step"
                tensors[f"first_logits/{key}"] = logits
            doc["cases"].append({"name": name, "prompt_ids": ids, "images": imgs,
                                 "prefill_step_size": pss, "tokens": toks, "margins": margins})
    by = {c["name"]: c["tokens"] for c in doc["cases"]}
    assert by["image_a"] != by["image_b"] != by["image_c"], "images must change the trajectory"
    assert by["image_a/chunk5"] == by["image_a"]
    mx.save_safetensors(str(VISION_DIR / "gemma3.safetensors"), tensors, metadata={"format": "mlx"})
    (HERE / "gemma3_vision.json").write_text(json.dumps(doc, indent=1) + "\n")
    for c in doc["cases"]:
        print(c["name"], c["tokens"], round(min(c["margins"]), 4))


def check_text():
    """Runs goldens/gemma3.json (made with mlx 0.32.2) through this venv's mlx."""
    site = sorted((HERE.parent / ".venv" / "lib").glob("python*/site-packages"))[0]
    sys.path.append(str(site))  # after this venv's own paths: mlx stays 0.32.4
    import mlx_lm  # noqa: F401
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.utils import load_model

    assert mx.__version__ == "0.32.4", mx.__version__
    mx.set_default_device(mx.cpu)
    g = json.loads((HERE / "gemma3.json").read_text())
    model, _ = load_model(HERE / "models" / "gemma3-text")
    same_tokens = same_logits = 0
    for case in g["single"]:
        cache = make_prompt_cache(model)
        steps = list(generate_step(
            mx.array(case["prompt_ids"], dtype=mx.uint32), model, max_tokens=len(case["tokens"]),
            sampler=lambda lp: mx.argmax(lp, axis=-1), prompt_cache=cache,
            prefill_step_size=case["prefill_step_size"]))
        same_tokens += [int(t) for t, _ in steps] == case["tokens"]
        first = np.array(steps[0][1].astype(mx.float32)).reshape(-1)
        same_logits += np.array_equal(first, np.array(case["first_logprobs"], np.float32))
    n = len(g["single"])
    print(f"mlx {mx.__version__} vs goldens/gemma3.json (mlx {g['mlx_version']}): "
          f"tokens equal {same_tokens}/{n}, first-step logprobs bit-equal {same_logits}/{n}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--check-text", action="store_true")
    if ap.parse_args().check_text:
        check_text()
    else:
        main()
