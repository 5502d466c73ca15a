#!/usr/bin/env python3
"""Images and audio in one request: goldens for a tiny Gemma 4 with both towers (second pinned
venv: mlx 0.32.4 / mlx-vlm 0.7.10; see make_gemma4_vision_goldens.py, make_audio_goldens.py).

Usage (from the repo root, after those two scripts):
    /work/vlm-venv/bin/python goldens/make_gemma4_vision_audio_goldens.py

Writes:
    goldens/models/gemma4-vision-audio/  models/gemma4-vision (text model + vision tower) with
                                         models/gemma4-audio's tower + embedder beside it (both
                                         safetensors files and the tokenizer / processor files
                                         are symlinks) and a config.json with both towers
    goldens/gemma4_vision_audio.json     prompts (an image span and an audio span, in both
                                         orders) and mlx-vlm generate_step greedy tokens

mlx-vlm's gemma4 `get_input_embeddings` takes pixel_values and input_features together: image
and audio soft tokens replace their placeholders, both take id 0 for the per-layer inputs; the
bidirectional overlay covers image spans only (mm_token_type_ids == 1 at image tokens).
"""

import json
import os
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
from PIL import Image

HERE = Path(__file__).resolve().parent
VISION = HERE / "models" / "gemma4-vision"
AUDIO = HERE / "models" / "gemma4-audio"
MODEL_DIR = HERE / "models" / "gemma4-vision-audio"


def main():
    import make_gemma4_vision_goldens as gv
    from mlx_vlm.generate.ar import generate_step
    from mlx_vlm.models.gemma4.audio_feature_extractor import Gemma4AudioFeatureExtractor
    from mlx_vlm.models.gemma4.processing_gemma4 import Gemma4Processor
    from mlx_vlm.utils import load_audio, load_model
    import types

    mx.set_default_device(mx.cpu)
    if MODEL_DIR.exists():
        shutil.rmtree(MODEL_DIR)
    MODEL_DIR.mkdir()
    for name in ("tokenizer_config.json", "processor_config.json"):
        os.symlink(f"../gemma4-vision/{name}", MODEL_DIR / name)
    # The vision tokenizer with the audio tokens named and special (as in Gemma 4's vocabulary),
    # so a rendered `<|audio|>` stays one token between trimmed text parts.
    tok = json.loads((VISION / "tokenizer.json").read_text())
    audio_tokens = {"<|audio|>": 253, "<|audio>": 254, "<audio|>": 255}
    vocab = {k: v for k, v in tok["model"]["vocab"].items() if v not in audio_tokens.values()}
    vocab.update(audio_tokens)
    tok["model"]["vocab"] = dict(sorted(vocab.items(), key=lambda kv: kv[1]))
    tok["added_tokens"] += [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": True} for c, i in audio_tokens.items()]
    (MODEL_DIR / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False) + "\n")
    os.symlink("../gemma4-vision/model.safetensors", MODEL_DIR / "model.safetensors")
    os.symlink("../gemma4-audio/model.safetensors", MODEL_DIR / "model-audio.safetensors")
    cfg = json.loads((VISION / "config.json").read_text())
    acfg = json.loads((AUDIO / "config.json").read_text())
    cfg["audio_config"] = acfg["audio_config"]
    cfg["audio_ms_per_token"] = 40
    cfg["audio_soft_tokens_per_image"] = 750
    (MODEL_DIR / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    model = load_model(MODEL_DIR)
    assert model.audio_tower is not None and model.vision_tower is not None
    IMAGE, BOI, EOI = cfg["image_token_id"], cfg["boi_token_id"], cfg["eoi_token_id"]
    AUD, BOA, EOA = cfg["audio_token_id"], cfg["boa_token_id"], cfg["eoa_token_id"]

    px, n_img = gv.pixel_values(Image.open(HERE / "vision" / "a.png"))
    clip = "audio/short-16k-mono.wav"
    wav = load_audio(str(HERE / clip), sr=16000)
    feats = Gemma4AudioFeatureExtractor()([wav], return_attention_mask=True)
    counter = types.SimpleNamespace(audio_ms_per_token=40, audio_seq_length=750)
    n_aud = Gemma4Processor._compute_audio_num_tokens(counter, wav, 16000)
    image_span = [BOI] + [IMAGE] * n_img + [EOI]
    audio_span = [BOA] + [AUD] * n_aud + [EOA]
    kwargs = dict(input_features=mx.array(np.stack(feats["input_features"])),
                  input_features_mask=mx.array(np.stack(feats["input_features_mask"])))
    doc = {"model_dir": "goldens/models/gemma4-vision-audio", "mlx_version": mx.__version__,
           "mlx_vlm_version": __import__("mlx_vlm").__version__, "image": "a", "clip": clip,
           "image_soft_tokens": n_img, "audio_soft_tokens": n_aud,
           "note": "tokens: mlx-vlm generate_step greedy with pixel_values, input_features, "
                   "input_features_mask and mm_token_type_ids (1 at image tokens), EOS ignored. "
                   "prompt_template_ids: what a caller sends (image span expanded, one audio "
                   "token for the clip).", "cases": []}
    cases = [
        ("image_then_audio", [2, 17] + image_span + [44, 9, 61] + audio_span + [12, 77, 150, 5]),
        ("audio_then_image", [2, 17] + audio_span + [44, 9] + image_span + [12, 77, 5]),
    ]
    for name, ids in cases:
        input_ids = mx.array([ids], dtype=mx.int32)
        types_ = (input_ids == IMAGE).astype(mx.int32)
        toks, margins = [], []
        for tok, lp in generate_step(input_ids, model, px[None], None, max_tokens=16,
                                     sampler=lambda l: mx.argmax(l, axis=-1), mm_token_type_ids=types_,
                                     **kwargs):
            v = np.array(lp.astype(mx.float32)).reshape(-1).astype(np.float64)
            i = int(np.argmax(v))
            margins.append(float(np.float32(v[i] - np.max(np.delete(v, i)))))
            toks.append(int(tok))
        template = []
        k = 0
        while k < len(ids):
            if ids[k] == BOA:
                template.append(AUD)
                k += n_aud + 2
            else:
                template.append(ids[k])
                k += 1
        doc["cases"].append({"name": name, "prompt_ids": ids, "prompt_template_ids": template,
                             "tokens": toks, "margins": margins})
        print(name, toks, round(min(margins), 4))
    # Each modality changes the trajectory (the composition is not a no-op of either).
    only_image = [int(t) for t, _ in generate_step(mx.array([cases[0][1]]), model, px[None], None, max_tokens=16,
                                                    sampler=lambda l: mx.argmax(l, axis=-1),
                                                    mm_token_type_ids=(mx.array([cases[0][1]]) == IMAGE).astype(mx.int32))]
    assert only_image != doc["cases"][0]["tokens"], "the audio must matter"
    (HERE / "gemma4_vision_audio.json").write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
