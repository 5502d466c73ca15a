#!/usr/bin/env python3
"""Gemma 4 audio goldens from the multimodal oracle.

Oracle (a second venv, because mlx-vlm needs a newer MLX than Weft pins):
    mlx 0.32.4 (mlx-cpu 0.32.4), mlx-vlm 0.7.10, mlx-audio 0.6.2, numpy 2.4.6, scipy 1.17.1,
    transformers 5.24.0

Usage (from the repo root):
    /work/vlm-venv/bin/python goldens/make_audio_goldens.py

Writes (deterministic, a few seconds):
    goldens/models/gemma4-audio/config.json           gemma4 config: tiny `audio_config`, the
                                                       text hidden size, the audio token ids
    goldens/models/gemma4-audio/model.safetensors     `audio_tower.*` + `embed_audio.*` in the
                                                       mlx-vlm layout (after its `sanitize`), float32
    goldens/audio/tones-16k-mono.wav                  1.2 s of tones + noise, 16 kHz mono PCM16
    goldens/audio/tones-44k-stereo.wav                0.75 s, 44.1 kHz stereo PCM16 (downmix + resample)
    goldens/audio/short-16k-mono.wav                  8321 samples: one soft token more than the
                                                       tower has rows (mlx-vlm wraps to row 0)
    goldens/audio/short-16k-mono.flac                 the same samples as FLAC (verbatim frames)
    goldens/audio/golden.safetensors                  per clip: the decoded 16 kHz waveform, mel
                                                       features + mask, tower output, embedder output
    goldens/audio.json                                versions, shapes, soft-token counts
    goldens/audio_lm.json                             text + audio end to end: the tiny Gemma 4
                                                       text model (models/gemma4_text) with this
                                                       audio tower in one mlx-vlm `Model`; greedy
                                                       tokens of an audio prompt (generate_step)
    goldens/models/gemma4-audio-lm/                   that `Model` as one checkpoint Weft loads
                                                       (language_model.* + audio_tower.* +
                                                       embed_audio.*, word-level tokenizer with
                                                       <|audio|>, pass-through chat template)
    goldens/audio_engine.json                         greedy tokens (generate_step) of each clip's
                                                       audio prompt and of a text prompt on it

`--engine` writes only the last two (from the committed weights).

Everything is computed with mlx-vlm's own code: `mlx_vlm.utils.load_audio` (mlx-audio's reader
and its Kaiser polyphase resampler), `Gemma4AudioFeatureExtractor`, `AudioEncoder`,
`MultimodalEmbedder`, and `Gemma4Processor._compute_audio_num_tokens`.
"""

import json
import math
import types
import wave
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

import mlx_vlm
from mlx_vlm.models.gemma4.audio import AudioEncoder
from mlx_vlm.models.gemma4.audio_feature_extractor import Gemma4AudioFeatureExtractor
from mlx_vlm.models.gemma4.config import AudioConfig
from mlx_vlm.models.gemma4.gemma4 import MultimodalEmbedder, masked_scatter
from mlx_vlm.models.gemma4.processing_gemma4 import Gemma4Processor
from mlx_vlm.utils import load_audio

HERE = Path(__file__).resolve().parent
MODEL_DIR = HERE / "models" / "gemma4-audio"
AUDIO_DIR = HERE / "audio"

TEXT_HIDDEN = 64
AUDIO_CONFIG = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    hidden_act="silu",
    subsampling_conv_channels=[8, 4],
    conv_kernel_size=5,
    residual_weight=0.5,
    attention_chunk_size=12,
    attention_context_left=13,
    attention_context_right=0,
    attention_logit_cap=50.0,
    attention_invalid_logits_value=-1e9,
    use_clipped_linears=True,
    rms_norm_eps=1e-6,
    gradient_clipping=10000000000.0,
    output_proj_dims=48,
)
# Gemma 4's token ids (mlx-vlm ModelConfig defaults, as in the real checkpoints).
TOKEN_IDS = dict(audio_token_id=258881, boa_token_id=256000, eoa_token_id=258883)


def write_wav(path, samples, rate):
    """samples: float array [n] or [n, channels] in [-1, 1] -> PCM16 WAV."""
    samples = np.asarray(samples)
    if samples.ndim == 1:
        samples = samples[:, None]
    pcm = np.clip(np.round(samples * 32767.0), -32768, 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(samples.shape[1])
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())


def _crc(data, poly, bits):
    """MSB-first CRC with init 0 (FLAC's CRC-8 poly 0x07 and CRC-16 poly 0x8005)."""
    crc, top, mask = 0, 1 << (bits - 1), (1 << bits) - 1
    for byte in data:
        crc ^= byte << (bits - 8)
        for _ in range(8):
            crc = ((crc << 1) ^ poly) & mask if crc & top else (crc << 1) & mask
    return crc


def write_flac_verbatim(path, pcm16, rate, block=4096):
    """A mono 16-bit FLAC file with VERBATIM subframes (no encoder is installed here; the
    format is simple enough uncompressed): STREAMINFO, then fixed-size frames."""
    pcm16 = np.asarray(pcm16, dtype=">i2")
    n = len(pcm16)
    info = block.to_bytes(2, "big") * 2  # min/max block size
    info += (0).to_bytes(6, "big")  # min/max frame size unknown
    packed = rate << 44 | 0 << 41 | 15 << 36 | n  # rate, channels-1, bps-1, total samples
    info += packed.to_bytes(8, "big") + bytes(16)  # + MD5 unknown
    out = bytearray(b"fLaC" + bytes([0x80, 0, 0, 34]) + info)
    for f, start in enumerate(range(0, n, block)):
        chunk = pcm16[start:start + block]
        assert f < 128  # one-byte UTF-8 frame number
        hdr = bytes([0xFF, 0xF8, 0x70, 0x08, f]) + (len(chunk) - 1).to_bytes(2, "big")
        hdr += bytes([_crc(hdr, 0x07, 8)])
        frame = hdr + bytes([0x02]) + chunk.tobytes()  # subframe: VERBATIM, no wasted bits
        out += frame + _crc(frame, 0x8005, 16).to_bytes(2, "big")
    Path(path).write_bytes(bytes(out))


def clip(rate, seconds, stereo, rng):
    n = seconds if isinstance(seconds, int) else int(round(rate * seconds))  # int = samples
    t = np.arange(n) / rate
    tone = 0.3 * np.sin(2 * np.pi * 440.0 * t) + 0.2 * np.sin(2 * np.pi * 1234.5 * t)
    chirp = 0.15 * np.sin(2 * np.pi * (200.0 * t + 1500.0 * t * t))
    env = np.minimum(1.0, t / 0.05)  # a soft start
    left = env * (tone + chirp) + 0.03 * rng.standard_normal(t.shape)
    if not stereo:
        return left
    right = env * (0.25 * np.sin(2 * np.pi * 3000.0 * t)) + 0.03 * rng.standard_normal(t.shape)
    return np.stack([left, right], axis=1)


def randomize(module, rng, clip_bounds):
    """Seeded random weights in place of mlx-vlm's init (which leaves norms at one, per_dim_scale
    and the depthwise conv at zero, and the clip bounds at +-inf, so nothing would be exercised).
    Clip bounds are finite and tight enough that some activations really are clamped."""
    params = dict(tree_flatten(module.parameters()))
    out = {}
    for k, v in sorted(params.items()):
        leaf = k.split(".")[-1]
        if leaf in ("input_min", "output_min"):
            out[k] = mx.array(-clip_bounds * float(rng.uniform(0.8, 1.2)), dtype=mx.float32)
        elif leaf in ("input_max", "output_max"):
            out[k] = mx.array(clip_bounds * float(rng.uniform(0.8, 1.2)), dtype=mx.float32)
        elif "norm" in k and leaf == "weight" and v.ndim == 1:
            out[k] = mx.array(rng.uniform(0.5, 1.5, v.shape).astype(np.float32))
        elif leaf == "per_dim_scale":
            out[k] = mx.array(rng.uniform(-0.5, 0.5, v.shape).astype(np.float32))
        else:
            fan_in = int(np.prod(v.shape[1:])) if v.ndim > 1 else int(v.shape[0])
            scale = 1.0 / math.sqrt(max(fan_in, 1))
            out[k] = mx.array((rng.standard_normal(v.shape) * scale).astype(np.float32))
    module.update(tree_unflatten(list(out.items())))
    return out


def main():
    rng = np.random.default_rng(20261201)
    MODEL_DIR.mkdir(parents=True, exist_ok=True)
    AUDIO_DIR.mkdir(parents=True, exist_ok=True)

    cfg = AudioConfig.from_dict(AUDIO_CONFIG)
    tower = AudioEncoder(cfg)
    embedder = MultimodalEmbedder(cfg.output_proj_dims, TEXT_HIDDEN, eps=cfg.rms_norm_eps)
    tower_params = randomize(tower, rng, clip_bounds=2.5)
    embed_params = randomize(embedder, rng, clip_bounds=2.5)
    weights = {f"audio_tower.{k}": v for k, v in tower_params.items()}
    weights.update({f"embed_audio.{k}": v for k, v in embed_params.items()})
    mx.save_safetensors(str(MODEL_DIR / "model.safetensors"), weights, metadata={"format": "mlx"})
    config = {
        "model_type": "gemma4",
        "audio_config": {"model_type": "gemma4_audio", **AUDIO_CONFIG},
        "text_config": {"model_type": "gemma4_text", "hidden_size": TEXT_HIDDEN},
        "audio_ms_per_token": 40,
        "audio_soft_tokens_per_image": 750,
        **TOKEN_IDS,
    }
    (MODEL_DIR / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    clips = {
        "tones-16k-mono": (16000, 1.2, False),
        "tones-44k-stereo": (44100, 0.75, True),
        "short-16k-mono": (16000, 8321, False),
    }
    extractor = Gemma4AudioFeatureExtractor()
    counter = types.SimpleNamespace(audio_ms_per_token=40, audio_seq_length=750)
    golden = {}
    meta = {
        "mlx_version": mx.__version__,
        "mlx_vlm_version": mlx_vlm.__version__,
        "numpy_version": np.__version__,
        "model": "models/gemma4-audio",
        "clips": {},
    }
    for name, (rate, seconds, stereo) in clips.items():
        path = AUDIO_DIR / f"{name}.wav"
        samples = clip(rate, seconds, stereo, rng)
        write_wav(path, samples, rate)
        if name == "short-16k-mono":
            # The same PCM as FLAC: its golden is the WAV's (checked equal here).
            pcm = np.clip(np.round(samples * 32767.0), -32768, 32767).astype(np.int16)
            write_flac_verbatim(AUDIO_DIR / f"{name}.flac", pcm, rate)
            from_flac = load_audio(str(AUDIO_DIR / f"{name}.flac"), sr=16000)
            assert np.array_equal(from_flac, load_audio(str(path), sr=16000)), "FLAC != WAV"
        wav = load_audio(str(path), sr=16000)
        feats = extractor([wav], return_attention_mask=True)
        mel = np.asarray(feats["input_features"][0], dtype=np.float32)
        mel_mask = np.asarray(feats["input_features_mask"][0]).astype(bool)
        enc, enc_mask = tower(mx.array(mel)[None], mx.array(~mel_mask)[None])
        emb = embedder(enc)
        mx.eval(enc, emb, enc_mask)
        n = Gemma4Processor._compute_audio_num_tokens(counter, wav, 16000)
        golden[f"{name}.waveform"] = mx.array(wav.astype(np.float32))
        golden[f"{name}.mel"] = mx.array(mel)
        golden[f"{name}.mel_mask"] = mx.array(mel_mask.astype(np.uint8))
        golden[f"{name}.tower"] = enc[0]
        golden[f"{name}.tower_mask"] = enc_mask[0].astype(mx.uint8)
        golden[f"{name}.embeddings"] = emb[0]
        # The splice: `boa + audio x n + eoa` between two text tokens, scattered by mlx-vlm's own
        # masked_scatter into stand-in text embeddings (1.0 everywhere) -> [n + 4, text hidden].
        ids = [2, TOKEN_IDS["boa_token_id"]] + [TOKEN_IDS["audio_token_id"]] * n
        ids += [TOKEN_IDS["eoa_token_id"], 106]
        ids = mx.array(ids)[None]
        text = mx.ones((1, ids.shape[1], TEXT_HIDDEN), dtype=mx.float32)
        mask = mx.broadcast_to((ids == TOKEN_IDS["audio_token_id"])[..., None], text.shape)
        golden[f"{name}.spliced"] = masked_scatter(text, mask, emb)[0]
        meta["clips"][name] = {
            "file": f"audio/{name}.wav",
            "source_rate": rate,
            "source_channels": 2 if stereo else 1,
            "samples_16k": int(wav.shape[0]),
            "mel_frames": int(mel.shape[0]),
            "tower_frames": int(enc.shape[1]),
            "soft_tokens": int(n),
        }
    # A batch of two clips as mlx-vlm's extractor pads them (to the longer one): the shorter
    # clip's features are its own frames then masked zero frames (checked), so only the tower
    # outputs are stored; the test builds the batch from the single-clip mels.
    pair = ["tones-16k-mono", "short-16k-mono"]
    feats = extractor([np.asarray(golden[f"{n}.waveform"]) for n in pair], return_attention_mask=True)
    bmel = mx.array(np.stack(feats["input_features"]))
    bmask = mx.array(np.stack(feats["input_features_mask"]))
    for i, n in enumerate(pair):
        frames = golden[f"{n}.mel"].shape[0]
        assert mx.array_equal(bmel[i, :frames], golden[f"{n}.mel"]).item()
        assert not bmel[i, frames:].any().item() and not bmask[i, frames:].any().item()
    benc, bmask_out = tower(bmel, ~bmask)
    golden["batch.tower"] = benc
    golden["batch.tower_mask"] = bmask_out.astype(mx.uint8)
    golden["batch.embeddings"] = embedder(benc)
    meta["batch"] = {"clips": pair, "note": "batch.* in golden.safetensors: the two clips "
                     "through the tower as one padded batch (the extractor's padding)"}
    # The real checkpoints keep the tower in bfloat16: the same weights cast to bfloat16 (as a
    # bf16 checkpoint would hold them), float32 features in, as mlx-vlm runs it.
    tower16 = AudioEncoder(cfg)
    tower16.load_weights([(k, v.astype(mx.bfloat16)) for k, v in tower_params.items()])
    embed16 = MultimodalEmbedder(cfg.output_proj_dims, TEXT_HIDDEN, eps=cfg.rms_norm_eps)
    embed16.load_weights([(k, v.astype(mx.bfloat16)) for k, v in embed_params.items()])
    name = "tones-16k-mono"
    mel = golden[f"{name}.mel"][None]
    enc16, _ = tower16(mel, (golden[f"{name}.mel_mask"] == 0)[None])
    emb16 = embed16(enc16)
    golden[f"bf16.{name}.tower"] = enc16[0]
    golden[f"bf16.{name}.embeddings"] = emb16[0]
    mx.save_safetensors(str(AUDIO_DIR / "golden.safetensors"), golden, metadata={"format": "mlx"})
    (HERE / "audio.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(json.dumps(meta, indent=2))
    lm = audio_lm_golden(weights)
    (HERE / "audio_lm.json").write_text(json.dumps(lm, indent=1) + "\n")
    print("audio_lm tokens", lm["tokens"])


# The end-to-end golden's token ids: inside the tiny text model's 256-token vocabulary.
LM_TOKEN_IDS = dict(audio_token_id=250, boa_token_id=251, eoa_token_id=252)


def audio_lm_golden(audio_weights):
    """mlx-vlm's gemma4 `Model` over models/gemma4_text (text, verified against mlx-lm by
    gemma4_text.json) and models/gemma4-audio; no new weights are written."""
    from mlx_vlm.generate.ar import generate_step
    from mlx_vlm.models.gemma4.config import ModelConfig, TextConfig, VisionConfig
    from mlx_vlm.models.gemma4.gemma4 import Model

    text_dir = HERE / "models" / "gemma4_text"
    text_cfg = json.loads((text_dir / "config.json").read_text())
    cfg = ModelConfig.from_dict({
        "model_type": "gemma4",
        "text_config": text_cfg,
        # Unused (no images) but always built by mlx-vlm: kept tiny.
        "vision_config": dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                              num_attention_heads=2, num_key_value_heads=2, head_dim=8,
                              global_head_dim=8),
        "audio_config": AUDIO_CONFIG,
        "vocab_size": text_cfg["vocab_size"],
        "hidden_size": text_cfg["hidden_size"],
        "eos_token_id": None,
        **LM_TOKEN_IDS,
    })
    cfg.text_config = TextConfig.from_dict(text_cfg)
    cfg.vision_config = VisionConfig.from_dict(cfg.vision_config)
    cfg.audio_config = AudioConfig.from_dict(AUDIO_CONFIG)
    model = Model(cfg)
    text_w = mx.load(str(text_dir / "model.safetensors"))
    weights = {f"language_model.{k}": v for k, v in text_w.items()}
    weights.update(audio_weights)
    weights = model.language_model.sanitize(weights) if hasattr(model.language_model, "sanitize") else weights
    model.load_weights(list(weights.items()), strict=False)
    model.eval()
    mx.eval(model.parameters())
    # The text path must be mlx-lm's: first logits of gemma4_text.json's first prompt.
    g = json.loads((HERE / "gemma4_text.json").read_text())["single"][0]
    cache = model.language_model.make_cache()
    out = model(mx.array([g["prompt_ids"]]), cache=cache)
    logits = (out.logits if hasattr(out, "logits") else out)[0, -1]
    text_diff = float(mx.abs(logits - mx.array(g["first_logits"])).max())
    assert text_diff == 0.0, f"mlx-vlm's gemma4 text differs from mlx-lm's golden by {text_diff}"

    wav = load_audio(str(AUDIO_DIR / "tones-44k-stereo.wav"), sr=16000)
    feats = Gemma4AudioFeatureExtractor()([wav], return_attention_mask=True)
    counter = types.SimpleNamespace(audio_ms_per_token=40, audio_seq_length=750)
    n = Gemma4Processor._compute_audio_num_tokens(counter, wav, 16000)
    template_ids = [2, 10, LM_TOKEN_IDS["audio_token_id"], 11, 12]
    ids = [2, 10, LM_TOKEN_IDS["boa_token_id"]] + [LM_TOKEN_IDS["audio_token_id"]] * n
    ids += [LM_TOKEN_IDS["eoa_token_id"], 11, 12]
    features = mx.array(np.stack(feats["input_features"]))
    mask = mx.array(np.stack(feats["input_features_mask"]))
    tokens, first_logprobs = [], None
    for tok, logprobs in generate_step(
            mx.array([ids]), model, None, None, max_tokens=16, temperature=0.0,
            input_features=features, input_features_mask=mask):
        tokens.append(int(tok.item() if hasattr(tok, "item") else tok))
        if first_logprobs is None:
            first_logprobs = np.asarray(logprobs.astype(mx.float32)).reshape(-1).tolist()
    return {
        "mlx_version": mx.__version__,
        "mlx_vlm_version": mlx_vlm.__version__,
        "note": "mlx-vlm gemma4 Model = models/gemma4_text (language_model.*) + "
                "models/gemma4-audio (audio_tower.*, embed_audio.*), audio token ids below "
                "(inside the 256-token vocabulary). prompt_template_ids has one <|audio|> "
                "placeholder; prompt_ids is the processor's expansion for clip "
                "audio/tones-44k-stereo.wav (n soft tokens). tokens = generate_step(prompt_ids, "
                "temperature=0, input_features, input_features_mask), EOS ignored; "
                "first_logprobs = the logprobs that produced tokens[0]. The text path was "
                "checked equal to gemma4_text.json's first logits (mlx-lm) before this ran.",
        "text_model": "models/gemma4_text",
        "audio_model": "models/gemma4-audio",
        "clip": "audio/tones-44k-stereo.wav",
        **LM_TOKEN_IDS,
        "soft_tokens": int(n),
        "prompt_template_ids": template_ids,
        "prompt_ids": ids,
        "tokens": tokens,
        "first_logprobs": first_logprobs,
    }


LM_DIR = HERE / "models" / "gemma4-audio-lm"
LM_TOKENS = {"<|audio|>": 250, "<|audio>": 251, "<audio|>": 252}


def build_lm(audio_weights):
    """mlx-vlm's gemma4 `Model` over models/gemma4_text + models/gemma4-audio."""
    from mlx_vlm.models.gemma4.config import ModelConfig, TextConfig, VisionConfig
    from mlx_vlm.models.gemma4.gemma4 import Model

    text_dir = HERE / "models" / "gemma4_text"
    text_cfg = json.loads((text_dir / "config.json").read_text())
    cfg = ModelConfig.from_dict({
        "model_type": "gemma4", "text_config": text_cfg,
        "vision_config": dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                              num_attention_heads=2, num_key_value_heads=2, head_dim=8,
                              global_head_dim=8),
        "audio_config": AUDIO_CONFIG, "vocab_size": text_cfg["vocab_size"],
        "hidden_size": text_cfg["hidden_size"], "eos_token_id": None, **LM_TOKEN_IDS,
    })
    cfg.text_config = TextConfig.from_dict(text_cfg)
    cfg.vision_config = VisionConfig.from_dict(cfg.vision_config)
    cfg.audio_config = AudioConfig.from_dict(AUDIO_CONFIG)
    model = Model(cfg)
    text_w = mx.load(str(text_dir / "model.safetensors"))
    weights = {f"language_model.{k}": v for k, v in text_w.items()}
    weights.update(audio_weights)
    model.load_weights(list(weights.items()), strict=False)
    model.eval()
    mx.eval(model.parameters())
    return model, text_cfg, weights


def audio_engine_golden():
    """The combined checkpoint and greedy trajectories the engine tests replay (single
    sequences: mlx-vlm does not batch audio rows; batched rows are gated by equality with these)."""
    from mlx_vlm.generate.ar import generate_step

    audio_weights = mx.load(str(MODEL_DIR / "model.safetensors"))
    model, text_cfg, weights = build_lm(audio_weights)
    LM_DIR.mkdir(parents=True, exist_ok=True)
    config = {"model_type": "gemma4", "text_config": text_cfg, "audio_config": AUDIO_CONFIG,
              "vocab_size": text_cfg["vocab_size"], "audio_ms_per_token": 40,
              "audio_soft_tokens_per_image": 750, "eos_token_id": 1, **LM_TOKEN_IDS}
    (LM_DIR / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    mx.save_safetensors(str(LM_DIR / "model.safetensors"), weights, metadata={"format": "mlx"})
    vocab = {f"t{i}": i for i in range(text_cfg["vocab_size"]) if i not in LM_TOKENS.values()}
    vocab.update(LM_TOKENS)
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for c, i in LM_TOKENS.items()],
        "normalizer": None,
        "pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "Removed", "invert": False},
        "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": dict(sorted(vocab.items(), key=lambda kv: kv[1])), "unk_token": "t0"},
    }
    (LM_DIR / "tokenizer.json").write_text(json.dumps(tok) + "\n")
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    (LM_DIR / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}) + "\n")
    from tokenizers import Tokenizer

    t = Tokenizer.from_file(str(LM_DIR / "tokenizer.json"))
    text_prompt = "t2 t10 <|audio|> t11 t12"
    template_ids = [2, 10, LM_TOKEN_IDS["audio_token_id"], 11, 12]
    assert t.encode(text_prompt).ids == template_ids, t.encode(text_prompt).ids

    counter = types.SimpleNamespace(audio_ms_per_token=40, audio_seq_length=750)
    cases = []
    for name in ["tones-44k-stereo", "tones-16k-mono", "short-16k-mono", None]:
        kwargs, ids = {}, [2, 10, 11, 12, 13]
        if name is not None:
            wav = load_audio(str(AUDIO_DIR / f"{name}.wav"), sr=16000)
            feats = Gemma4AudioFeatureExtractor()([wav], return_attention_mask=True)
            n = Gemma4Processor._compute_audio_num_tokens(counter, wav, 16000)
            ids = [2, 10, LM_TOKEN_IDS["boa_token_id"]] + [LM_TOKEN_IDS["audio_token_id"]] * n
            ids += [LM_TOKEN_IDS["eoa_token_id"], 11, 12]
            kwargs = dict(input_features=mx.array(np.stack(feats["input_features"])),
                          input_features_mask=mx.array(np.stack(feats["input_features_mask"])))
        tokens = []
        for tok_, _ in generate_step(mx.array([ids]), model, None, None, max_tokens=16,
                                     temperature=0.0, **kwargs):
            tokens.append(int(tok_.item() if hasattr(tok_, "item") else tok_))
        cases.append({"name": name or "text", "clip": name and f"audio/{name}.wav",
                      "prompt_template_ids": template_ids if name else ids, "prompt_ids": ids,
                      "tokens": tokens})
    lm = json.loads((HERE / "audio_lm.json").read_text())
    assert cases[0]["tokens"] == lm["tokens"], "the combined checkpoint reproduces audio_lm.json"
    out = {"mlx_version": mx.__version__, "mlx_vlm_version": mlx_vlm.__version__,
           "model": "models/gemma4-audio-lm", "text_prompt": text_prompt, **LM_TOKEN_IDS,
           "note": "tokens = mlx-vlm generate_step(prompt_ids, temperature=0, input_features, "
                   "input_features_mask) on the gemma4 Model of models/gemma4-audio-lm, 16 "
                   "steps, EOS ignored; prompt_template_ids is what a caller sends (one "
                   "<|audio|> per clip); text_prompt tokenizes to prompt_template_ids.",
           "cases": cases}
    (HERE / "audio_engine.json").write_text(json.dumps(out, indent=1) + "\n")
    print("audio_engine", [(c["name"], c["tokens"]) for c in cases])


if __name__ == "__main__":
    import sys

    if "--engine" not in sys.argv:
        main()
    audio_engine_golden()
