#!/usr/bin/env python3
"""Gemma 3 pan-and-scan goldens from the reference processor + mlx-vlm (the second pinned venv:
mlx 0.32.4 / mlx-vlm 0.7.10, transformers 5.24.0, pillow 13.0.0; see make_vision_goldens.py).

Usage (from the repo root, after make_vision_goldens.py):
    /work/vlm-venv/bin/python goldens/make_vision_pan_and_scan_goldens.py

Writes (deterministic, a few seconds):
    goldens/models/gemma3-vision-pas/   the tiny gemma3 VLM of make_vision_goldens.py (its
                                        model.safetensors and config.json are symlinks) with a
                                        preprocessor_config.json that turns pan-and-scan on (the
                                        way a user of the reference turns it on) and a tokenizer
                                        whose vocabulary spells the processor's crop sentence
    goldens/vision/e.png, f.png         a wide and a tall test image
    goldens/vision/gemma3_pas.safetensors  pixel values (original + crops) per image
    goldens/gemma3_pan_and_scan.json    expanded prompt ids per image, greedy trajectories

The reference: mlx-vlm's Gemma3Processor (processing_gemma3.py) with transformers'
Gemma3ImageProcessorPil (`do_pan_and_scan`, `pan_and_scan_min_crop_size`,
`pan_and_scan_max_num_crops`, `pan_and_scan_min_ratio_to_activate`, read from
preprocessor_config.json by AutoImageProcessor). Crops are cut from the RGB image (uint8),
then each view is resized, rescaled and normalised as the original is; the prompt's
`<start_of_image>` becomes "Here is the original image " boi " and here are some crops to help
you see better " + " ".join(boi x crops), and every boi then the full image sequence.
mlx-vlm passes a per-call `do_pan_and_scan` through `--processor-kwargs`.
"""

import json
import os
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
from PIL import Image

import make_vision_goldens as base

HERE = Path(__file__).resolve().parent
SRC = HERE / "models" / "gemma3-vision"
MODEL_DIR = HERE / "models" / "gemma3-vision-pas"
PAS = {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 16, "pan_and_scan_max_num_crops": 4,
       "pan_and_scan_min_ratio_to_activate": 1.2}
# The crop sentence's words take over these ids of the tiny vocabulary ("t<id>").
WORDS = ["Here", "is", "the", "original", "image", "and", "here", "are", "some", "crops", "to", "help",
         "you", "see", "better"]
FIRST_WORD_ID = 400


def make_images():
    rng = np.random.RandomState(11)
    e = rng.randint(0, 256, (20, 100, 3)).astype(np.uint8)  # wide: 4 crops (max_num_crops)
    y, x = np.mgrid[0:70, 0:20]
    f = np.stack([(x * 9) % 256, (y * 3) % 256, ((x * y) * 5) % 256], -1)
    f = np.clip(f + rng.randint(-20, 21, f.shape), 0, 255).astype(np.uint8)  # tall: 4 crops, last shorter
    Image.fromarray(e, "RGB").save(base.VISION_DIR / "e.png", optimize=True)
    Image.fromarray(f, "RGB").save(base.VISION_DIR / "f.png", optimize=True)


def make_model_dir():
    if MODEL_DIR.exists():
        shutil.rmtree(MODEL_DIR)
    MODEL_DIR.mkdir()
    for name in ("model.safetensors", "config.json", "tokenizer_config.json"):
        os.symlink(f"../gemma3-vision/{name}", MODEL_DIR / name)
    tok = json.loads((SRC / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    for k, word in enumerate(WORDS):
        i = FIRST_WORD_ID + k
        del vocab[f"t{i}"]
        vocab[word] = i
    tok["model"]["vocab"] = dict(sorted(vocab.items(), key=lambda kv: kv[1]))
    (MODEL_DIR / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False) + "\n")
    cfg = {"image_processor_type": "Gemma3ImageProcessor", "processor_class": "Gemma3Processor",
           **base.PROCESSOR, "do_resize": True, "do_rescale": True, "do_normalize": True, **PAS}
    (MODEL_DIR / "preprocessor_config.json").write_text(json.dumps(cfg, indent=1) + "\n")


def processor():
    from mlx_vlm.models.gemma3.processing_gemma3 import Gemma3Processor
    from transformers import AutoImageProcessor, PreTrainedTokenizerFast

    ip = AutoImageProcessor.from_pretrained(str(MODEL_DIR), use_fast=False)
    assert type(ip).__name__ == "Gemma3ImageProcessorPil" and ip.do_pan_and_scan, ip
    tok = PreTrainedTokenizerFast(tokenizer_file=str(MODEL_DIR / "tokenizer.json"))
    tok.boi_token, tok.eoi_token, tok.image_token = "<start_of_image>", "<end_of_image>", "<image_soft_token>"
    tok.image_token_id = base.IMAGE_TOKEN
    return Gemma3Processor(image_processor=ip, tokenizer=tok, image_seq_length=4)


def main():
    mx.set_default_device(mx.cpu)
    make_images()
    make_model_dir()
    proc = processor()
    from mlx_vlm.utils import load_model

    model = load_model(MODEL_DIR)
    tensors = {}
    doc = {"model_dir": "goldens/models/gemma3-vision-pas", "mlx_version": mx.__version__,
           "mlx_vlm_version": __import__("mlx_vlm").__version__,
           "transformers_version": __import__("transformers").__version__,
           "pan_and_scan": PAS, "images": {}, "cases": []}
    text = "t2 t17 t93<start_of_image>t44 t0 t301 t12 t77"
    for stem in ("a", "b", "c", "e", "f"):
        im = Image.open(base.VISION_DIR / f"{stem}.png")
        out = proc(images=[im], text=[text])
        ids = [int(i) for i in np.array(out["input_ids"][0])]
        px = np.array(out["pixel_values"]).astype(np.float32)
        # the crops' own count, from the reference image processor
        crops = int(proc.image_processor([im], return_tensors="np")["num_crops"][0])
        assert px.shape == (1 + crops, 3, 32, 32), px.shape
        assert ids.count(base.IMAGE_TOKEN) == 4 * (1 + crops)
        tensors[f"pixels/{stem}"] = mx.array(px)
        doc["images"][stem] = {"file": f"goldens/vision/{stem}.png", "size": list(im.size), "crops": crops,
                               "text": text, "prompt_ids": ids}
        # Off per call (mlx-vlm --processor-kwargs '{"do_pan_and_scan": false}'): one view.
        off = proc(images=[im], text=[text], do_pan_and_scan=False)
        doc["images"][stem]["prompt_ids_off"] = [int(i) for i in np.array(off["input_ids"][0])]
        if stem in ("a", "e", "f"):
            toks, margins, _ = base.greedy(model, ids, mx.array(px), 12)
            doc["cases"].append({"name": f"pas_{stem}", "image": stem, "prompt_ids": ids, "tokens": toks,
                                 "margins": margins})
    mx.save_safetensors(str(base.VISION_DIR / "gemma3_pas.safetensors"), tensors, metadata={"format": "mlx"})
    (HERE / "gemma3_pan_and_scan.json").write_text(json.dumps(doc, indent=1) + "\n")
    for s, d in doc["images"].items():
        print(s, d["size"], "crops", d["crops"], len(d["prompt_ids"]))
    for c in doc["cases"]:
        print(c["name"], c["tokens"], round(min(c["margins"]), 4))


if __name__ == "__main__":
    main()
