#!/usr/bin/env python3
"""Audio feature-extractor settings from the checkpoint: goldens for a Gemma 4 audio model whose
processor_config.json sets extractor fields that differ from the class defaults (second pinned
venv: mlx 0.32.4 / mlx-vlm 0.7.10, see make_audio_goldens.py).

Usage (from the repo root, after make_audio_goldens.py):
    /work/vlm-venv/bin/python goldens/make_audio_extractor_goldens.py

Writes:
    goldens/models/gemma4-audio-lm-fe/   goldens/models/gemma4-audio-lm (its files as symlinks)
                                         plus processor_config.json {"feature_extractor": FE}
    goldens/audio/extractor.safetensors  per clip: the log-mel features mlx-vlm's
                                         Gemma4AudioFeatureExtractor(**FE) gives for the
                                         reference waveform in golden.safetensors, and its mask

mlx-vlm's Gemma4Processor.from_pretrained reads the `feature_extractor` object of
processor_config.json (else of preprocessor_config.json) and builds the extractor from it.
"""

import json
import os
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_vlm.models.gemma4.audio_feature_extractor import Gemma4AudioFeatureExtractor

HERE = Path(__file__).resolve().parent
SRC = HERE / "models" / "gemma4-audio-lm"
MODEL_DIR = HERE / "models" / "gemma4-audio-lm-fe"
FE = {"feature_extractor_type": "Gemma4AudioFeatureExtractor", "frame_length_ms": 32.0, "hop_length_ms": 16.0,
      "min_frequency": 125.0, "max_frequency": 7600.0, "preemphasis": 0.97, "mel_floor": 1e-2,
      "input_scale_factor": 0.5}
CLIPS = ["tones-16k-mono", "tones-44k-stereo", "short-16k-mono"]


def main():
    if MODEL_DIR.exists():
        shutil.rmtree(MODEL_DIR)
    MODEL_DIR.mkdir()
    for f in sorted(SRC.iterdir()):
        os.symlink(f"../gemma4-audio-lm/{f.name}", MODEL_DIR / f.name)
    (MODEL_DIR / "processor_config.json").write_text(json.dumps({"feature_extractor": FE}, indent=2) + "\n")
    fe = dict(FE)
    fe.pop("feature_extractor_type")
    extractor = Gemma4AudioFeatureExtractor(**fe)
    golden = mx.load(str(HERE / "audio" / "golden.safetensors"))
    out = {}
    for name in CLIPS:
        wav = np.asarray(golden[f"{name}.waveform"])
        feats = extractor([wav], return_attention_mask=True)
        mel = np.asarray(feats["input_features"][0], dtype=np.float32)
        default = np.asarray(golden[f"{name}.mel"])
        assert mel.shape != default.shape or not np.allclose(mel, default), name
        out[f"{name}.mel"] = mx.array(mel)
        out[f"{name}.mel_mask"] = mx.array(np.asarray(feats["input_features_mask"][0]).astype(np.uint8))
        print(name, mel.shape, "default", default.shape)
    mx.save_safetensors(str(HERE / "audio" / "extractor.safetensors"), out, metadata={"format": "mlx"})


if __name__ == "__main__":
    main()
