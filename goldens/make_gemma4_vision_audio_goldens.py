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
and audio soft tokens replace their placeholders, both take id 0 for the per-layer inputs.
Attention: Gemma4Processor's mm_token_type_ids mark image tokens 1 and audio tokens 3; with any
3 present the language model's `chunked_prefill_policy` lets generate_step chunk the prefill,
and a chunk's mask never has the full-length types' shape, so `_apply_blockwise_bidirectional_overlay`
leaves it causal (mlx-vlm's `_make_masks`: "keep mixed image+audio prompts causal"). A prompt
with both images and audio is therefore causal throughout; image spans attend both ways only
without audio. The cases pass the processor's types (checked against the processor's own).

The `messages` case goes through mlx-vlm's own request path: `prompt_utils.apply_chat_template`
(OpenAI content parts; it keeps image parts in place and appends the clip's `{"type": "audio"}`
after the user message's other parts, so the clip is the last part here), the model dir's
template (Gemma 4's part loop: text trimmed, `<|image|>`, `<|audio|>`), then
`utils.prepare_inputs` (Gemma4Processor expands both) and generate_step with every tensor it
returns, as `stream_generate` passes them.
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
# Gemma 4's content-part loop (string content as is; text parts trimmed, media as placeholders).
TEMPLATE = ("{% for m in messages %}{% if m['content'] is string %}{{ m['content'] }}{% else %}"
            "{% for item in m['content'] %}{% if item['type'] == 'text' %}{{ item['text'] | trim }}"
            "{% elif item['type'] == 'image' %}{{ '<|image|>' }}{% elif item['type'] == 'audio' %}"
            "{{ '<|audio|>' }}{% endif %}{% endfor %}{% endif %}{% endfor %}")


def main():
    import make_gemma4_vision_goldens as gv
    from mlx_vlm.generate.ar import generate_step
    from mlx_vlm.models.gemma4.audio_feature_extractor import Gemma4AudioFeatureExtractor
    from mlx_vlm.models.gemma4.processing_gemma4 import Gemma4Processor
    from mlx_vlm.prompt_utils import apply_chat_template
    from mlx_vlm.utils import load, load_audio, load_model, prepare_inputs
    import types

    mx.set_default_device(mx.cpu)
    if MODEL_DIR.exists():
        shutil.rmtree(MODEL_DIR)
    MODEL_DIR.mkdir()
    os.symlink("../gemma4-vision/processor_config.json", MODEL_DIR / "processor_config.json")
    # The media tokens named as Gemma 4's tokenizer_config names them (Gemma4Processor reads
    # the tokenizer's image_token / audio_token / boi... attributes to expand a prompt; its
    # padding needs a pad token: id 0, as Gemma's <pad>).
    specials = {"image_token": "<|image|>", "boi_token": "<|image>", "eoi_token": "<image|>",
                "audio_token": "<|audio|>", "boa_token": "<|audio>", "eoa_token": "<audio|>"}
    (MODEL_DIR / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": TEMPLATE, "pad_token": "t0", "extra_special_tokens": specials}) + "\n")
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
                   "input_features_mask and Gemma4Processor's mm_token_type_ids (1 at image "
                   "tokens, 3 at audio tokens: mixed prompts run causal), EOS ignored. "
                   "prompt_template_ids: what a caller sends (image span expanded, one audio "
                   "token for the clip). messages: OpenAI content parts through mlx-vlm's "
                   "apply_chat_template + prepare_inputs; rendered is the templated text.",
           "cases": []}
    cases = [
        ("image_then_audio", [2, 17] + image_span + [44, 9, 61] + audio_span + [12, 77, 150, 5]),
        ("audio_then_image", [2, 17] + audio_span + [44, 9] + image_span + [12, 77, 5]),
    ]
    def processor_types(input_ids):
        return (input_ids == IMAGE).astype(mx.int32) + 3 * (input_ids == AUD).astype(mx.int32)

    _, processor = load(str(MODEL_DIR))
    for name, ids in cases:
        input_ids = mx.array([ids], dtype=mx.int32)
        types_ = processor_types(input_ids)
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
    greedy = lambda l: mx.argmax(l, axis=-1)
    # The processor builds these prompts and types from their text.
    text = "t2 t17<|image|>t44 t9 t61<|audio|>t12 t77 t150 t5"
    built = prepare_inputs(processor, images=[str(HERE / "vision" / "a.png")], audio=[str(HERE / clip)], prompts=[text])
    assert np.array(built["input_ids"]).tolist() == [cases[0][1]], "processor prompt ids"
    assert np.array(built["mm_token_type_ids"]).tolist() == np.array(processor_types(mx.array([cases[0][1]]))).tolist()
    # Each modality changes the trajectory (the composition is not a no-op of either).
    only_image = [int(t) for t, _ in generate_step(mx.array([cases[0][1]]), model, px[None], None, max_tokens=16,
                                                    sampler=greedy,
                                                    mm_token_type_ids=(mx.array([cases[0][1]]) == IMAGE).astype(mx.int32))]
    assert only_image != doc["cases"][0]["tokens"], "the audio must matter"
    # With both, the image spans are causal: the same ids with image-only types (bidirectional
    # spans, what these goldens held before) give other tokens.
    both_ways = [int(t) for t, _ in generate_step(mx.array([cases[0][1]]), model, px[None], None, max_tokens=16,
                                                  sampler=greedy,
                                                  mm_token_type_ids=(mx.array([cases[0][1]]) == IMAGE).astype(mx.int32),
                                                  **kwargs)]
    assert both_ways != doc["cases"][0]["tokens"], "the mixed prompt must not take the overlay"
    doc["image_then_audio_bidirectional_tokens"] = both_ways

    # A chat request as mlx-vlm's server builds it: OpenAI content parts, apply_chat_template,
    # prepare_inputs (Gemma4Processor expands both placeholders), generate_step with all of it.
    messages = [{"role": "user", "content": [
        {"type": "text", "text": "t2 t17 "},
        {"type": "image_url", "image_url": {"url": "a.png"}},
        {"type": "text", "text": " t44 t9 t61 t12 "},
        {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]
    rendered = apply_chat_template(processor, model.config, messages, num_images=1, num_audios=1)
    assert rendered == "t2 t17<|image|>t44 t9 t61 t12<|audio|>", rendered
    inputs = prepare_inputs(processor, images=[str(HERE / "vision" / "a.png")], audio=[str(HERE / clip)],
                            prompts=[rendered])
    input_ids = inputs["input_ids"]
    data = {k: v for k, v in inputs.items() if k not in ("input_ids", "pixel_values", "attention_mask")}
    assert int(mx.sum(data["mm_token_type_ids"] == 3).item()) == n_aud
    toks, margins = [], []
    for tok, lp in generate_step(input_ids, model, inputs["pixel_values"], inputs.get("attention_mask"),
                                 max_tokens=16, sampler=greedy, **data):
        v = np.array(lp.astype(mx.float32)).reshape(-1).astype(np.float64)
        i = int(np.argmax(v))
        margins.append(float(np.float32(v[i] - np.max(np.delete(v, i)))))
        toks.append(int(tok))
    prompt = np.array(input_ids).reshape(-1).tolist()
    assert prompt[:2 + n_img + 2] == [2, 17] + image_span and prompt[-(n_aud + 2):] == audio_span, prompt
    doc["messages"] = {"messages": messages, "rendered": rendered, "prompt_ids": prompt,
                       "tokens": toks, "margins": margins}
    print("messages", toks, round(min(margins), 4))
    (HERE / "gemma4_vision_audio.json").write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
