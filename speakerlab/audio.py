"""Audio reading with soundfile: whole files for extraction, random crops for training.

Training expects 16 kHz mono; other rates or channel counts raise `AudioError` naming the file
(resampling belongs to the data pipeline, not here).
"""
from __future__ import annotations

import numpy as np
import soundfile as sf


class AudioError(ValueError):
    """An audio file cannot be used as it is; the message names the file."""


def audio_info(path: str, sample_rate: int = 16000) -> int:
    """Check rate and channels of `path` without decoding; return its length in samples."""
    try:
        info = sf.info(path)
    except Exception as e:  # soundfile raises RuntimeError / LibsndfileError subclasses
        raise AudioError(f"{path}: cannot open audio: {e}") from None
    if info.samplerate != sample_rate:
        raise AudioError(f"{path}: sample rate {info.samplerate} Hz, expected {sample_rate} Hz")
    if info.channels != 1:
        raise AudioError(f"{path}: {info.channels} channels, expected mono")
    return int(info.frames)


def read_audio(path: str, sample_rate: int = 16000) -> np.ndarray:
    """Decode a whole mono file: `(samples,)` float32 in [-1, 1)."""
    try:
        wave, sr = sf.read(path, dtype="float32", always_2d=True)
    except Exception as e:
        raise AudioError(f"{path}: cannot read audio: {e}") from None
    if sr != sample_rate:
        raise AudioError(f"{path}: sample rate {sr} Hz, expected {sample_rate} Hz")
    if wave.shape[1] != 1:
        raise AudioError(f"{path}: {wave.shape[1]} channels, expected mono")
    return wave[:, 0]


def read_crop(path: str, num_samples: int, total: int, rng: np.random.Generator,
              sample_rate: int = 16000) -> np.ndarray:
    """A random `(num_samples,)` float32 crop of a file with `total` samples.

    Only the frames of the crop are read from disk (soundfile seeks; no full decode). An utterance
    shorter than the crop is read whole and repeated end-to-end until it fills the crop: this keeps
    the speaker's own signal in every frame, where zero padding would add silence the model never
    sees at test time.
    """
    if total >= num_samples:
        start = int(rng.integers(0, total - num_samples + 1))
        try:
            wave, sr = sf.read(path, start=start, frames=num_samples, dtype="float32", always_2d=True)
        except Exception as e:
            raise AudioError(f"{path}: cannot read audio: {e}") from None
        if sr != sample_rate or wave.shape[1] != 1:
            raise AudioError(f"{path}: expected {sample_rate} Hz mono, got {sr} Hz x {wave.shape[1]} channels")
        wave = wave[:, 0]
        if wave.shape[0] != num_samples:  # header claimed more frames than the file holds
            raise AudioError(f"{path}: truncated file, read {wave.shape[0]} of {num_samples} samples at {start}")
        return wave
    wave = read_audio(path, sample_rate)
    if wave.shape[0] == 0:
        raise AudioError(f"{path}: empty audio file")
    reps = -(-num_samples // wave.shape[0])
    start = int(rng.integers(0, wave.shape[0]))  # random phase of the repetition
    return np.tile(wave, reps + 1)[start:start + num_samples]
