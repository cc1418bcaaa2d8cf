"""Small builders shared by the tests: wav files and Kaldi data dirs on disk."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Optional

import numpy as np
import soundfile as sf


def write_wav(path: Path, samples: np.ndarray, sample_rate: int = 16000, subtype: str = "PCM_16") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(path), samples, sample_rate, subtype=subtype)
    return path


def make_data_dir(
    root: Path, utts: Dict[str, str], seconds: float = 0.5, seed: int = 0, trials: Optional[str] = None
) -> Path:
    """A data dir with one random wav per utterance: `utts` maps utt -> speaker."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    scp, u2s = [], []
    for utt, spk in sorted(utts.items()):
        wav = write_wav(root / "wav" / f"{utt}.wav", 0.1 * rng.standard_normal(int(seconds * 16000)))
        scp.append(f"{utt} {wav}\n")
        u2s.append(f"{utt} {spk}\n")
    (root / "wav.scp").write_text("".join(scp))
    (root / "utt2spk").write_text("".join(u2s))
    if trials is not None:
        (root / "trials").write_text(trials)
    return root


def assert_no_traceback(*outputs: str) -> None:
    """Multi-process runs: no process may print a traceback, not even one that does not change the exit
    code (a forked loader worker's, say)."""
    for text in outputs:
        assert "Traceback" not in text, text[-3000:]


# Tiny random encoders of each self-supervised family (speakerlab.models.ssl): a few thousand weights,
# the published architectures otherwise (convolutional feature encoder of 7 layers, 20 ms frames).
_WAVE_ENCODER = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    conv_dim=(16,) * 7,
    num_conv_pos_embeddings=16,
    num_conv_pos_embedding_groups=2,
)
TINY_ENCODERS = {
    "wavlm": dict(_WAVE_ENCODER, model_type="wavlm", num_buckets=32, max_bucket_distance=80),
    "wav2vec2": dict(_WAVE_ENCODER, model_type="wav2vec2"),
    "hubert": dict(_WAVE_ENCODER, model_type="hubert"),
    "wav2vec2-bert": dict(
        model_type="wav2vec2-bert",
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        output_hidden_size=32,
        conv_depthwise_kernel_size=3,
        left_max_position_embeddings=8,
        right_max_position_embeddings=2,
    ),
}


def save_tiny_encoder(directory: Path, model_type: str, seed: int = 0) -> Path:
    """A tiny random encoder of `model_type` written by transformers' `save_pretrained` (config.json and
    model.safetensors), as a downloaded model directory would hold it."""
    import torch
    import transformers

    settings = dict(TINY_ENCODERS[model_type])
    config = transformers.AutoConfig.for_model(settings.pop("model_type"), **settings)
    torch.manual_seed(seed)
    transformers.AutoModel.from_config(config).save_pretrained(str(directory))
    return directory
