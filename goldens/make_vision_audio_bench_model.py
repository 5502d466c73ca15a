#!/usr/bin/env python3
"""A random-weight Gemma 4 with both towers at mlx-vlm's default (real-checkpoint) shapes, for
`weft bench --image / --audio` by hand (NOT committed: about 1.9 GB of float32). Second pinned
venv (mlx 0.32.4 / mlx-vlm 0.7.10).

    /work/vlm-venv/bin/python goldens/make_vision_audio_bench_model.py /tmp/gemma4-media-real

Vision tower: mlx-vlm VisionConfig defaults (16 layers, hidden 768, patch 16, pooling 3, 280
soft tokens per image, 2520 patches); audio tower: AudioConfig defaults (12 Conformer blocks,
hidden 1024, output 1536); text model: the tiny goldens/models/gemma4_text (hidden 64), so the
towers dominate. Weights: the classes' own initialisation, seeded; tokenizer from gemma4-vision.
"""

import json
import shutil
import sys
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

HERE = Path(__file__).resolve().parent


def main(out):
    from mlx_vlm.models.gemma4.config import AudioConfig, ModelConfig, TextConfig, VisionConfig
    from mlx_vlm.models.gemma4.gemma4 import Model

    mx.random.seed(7)
    text_cfg = json.loads((HERE / "models" / "gemma4_text" / "config.json").read_text())
    text_cfg["use_bidirectional_attention"] = "vision"
    vision = {"model_type": "gemma4_vision", "use_clipped_linears": True, "standardize": True}
    config = {"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"], "text_config": text_cfg,
              "vision_config": vision, "audio_config": {}, "vocab_size": text_cfg["vocab_size"],
              "hidden_size": text_cfg["hidden_size"], "image_token_id": 250, "boi_token_id": 251,
              "eoi_token_id": 252, "audio_token_id": 253, "boa_token_id": 254, "eoa_token_id": 255,
              "vision_soft_tokens_per_image": 280, "audio_ms_per_token": 40, "audio_soft_tokens_per_image": 750,
              "eos_token_id": 1, "torch_dtype": "float32"}
    mc = ModelConfig.from_dict(config)
    mc.text_config = TextConfig.from_dict(text_cfg)
    mc.vision_config = VisionConfig.from_dict(vision)
    mc.audio_config = AudioConfig.from_dict({})
    model = Model(mc)
    weights = {k: v for k, v in tree_flatten(model.parameters())
               if k.startswith(("vision_tower.", "embed_vision.", "audio_tower.", "embed_audio."))}
    text = mx.load(str(HERE / "models" / "gemma4_text" / "model.safetensors"))
    weights.update({f"language_model.{k}": v for k, v in text.items()})
    # Real checkpoints' audio_config / vision_config spell every field: write the defaults out.
    config["vision_config"] = {**mc.vision_config.__dict__}
    config["audio_config"] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in mc.audio_config.__dict__.items()}
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2, default=str) + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(HERE / "models" / "gemma4-vision-audio" / name, out / name)
    proc = {"image_processor": {"image_processor_type": "Gemma4ImageProcessor", "patch_size": 16,
                                "max_soft_tokens": 280, "pooling_kernel_size": 3, "resample": 3,
                                "rescale_factor": 1 / 255, "do_normalize": False, "do_convert_rgb": True}}
    (out / "processor_config.json").write_text(json.dumps(proc, indent=2) + "\n")
    n = sum(v.size for k, v in weights.items() if not k.startswith("language_model."))
    print(out, f"{n / 1e6:.1f}M tower parameters")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/gemma4-media-real")
