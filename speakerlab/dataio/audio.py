"""Audio reading with soundfile: whole files for extraction, random crops for training.

Training expects 16 kHz mono; other rates or channel counts raise `AudioError` naming the file
(resampling belongs to the data pipeline, not here).
"""

from __future__ import annotations

import os
import struct
import warnings
from typing import BinaryIO, Callable, Optional, Tuple, Union

import numpy as np

try:
    import soundfile as sf
except ImportError as e:  # the one place that says how to get it; other modules take `sf` from here
    raise ImportError(
        "speakerlab reads and writes audio with the soundfile package (libsndfile), which this Python "
        "lacks: pip install soundfile; on a machine without network, bring its wheels and those of cffi and "
        "pycparser (bash bench/fetch_gpu_wheels.sh) and set SPEAKERLAB_WHEELS=DIR for tests/run.sh or a recipe"
    ) from e


class AudioError(ValueError):
    """An audio file cannot be used as it is; the message names the file."""


class MultiChannelWarning(UserWarning):
    """A multi-channel file was read as its first channel; the message names the file."""


def read_first_channel(path: str, warn: Optional[Callable[[str], None]] = None) -> Tuple[np.ndarray, int]:
    """A whole file of any rate and channel count -> (`(samples,)` float32 of its first channel, its rate).

    A multi-channel file gives its first channel, and a message naming the file goes to `warn` (default:
    `warnings.warn(..., MultiChannelWarning)`): the other channels are dropped, not mixed, because a mixdown
    of a two-party call would blend two speakers. Errors (unreadable, empty) raise `AudioError` naming the
    file. Inference tools read through this, then resample (torch: speakerlab.dataio.waveform.resample; the ONNX
    runtime: scipy)."""
    try:
        wave, sr = sf.read(path, dtype="float32", always_2d=True)
    except Exception as e:  # soundfile raises RuntimeError / LibsndfileError subclasses
        raise AudioError(f"{path}: cannot read audio: {e}") from None
    if wave.shape[1] > 1:
        msg = f"{path}: {wave.shape[1]} channels, using the first"
        if warn is None:
            warnings.warn(msg, MultiChannelWarning, stacklevel=3)
        else:
            warn(msg)
    wave = np.ascontiguousarray(wave[:, 0])
    if wave.shape[0] == 0:
        raise AudioError(f"{path}: empty audio file")
    return wave, int(sr)


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


def wav_shortfall(path: str) -> Optional[Tuple[int, int]]:
    """(bytes of audio the header of a RIFF/WAVE file promises, bytes the file holds) when its data chunk is
    cut short by at least one frame (an interrupted copy or download: libsndfile then reads what is there and
    says nothing), else None: complete, another format, or a length left open (streaming writers' 0 or
    0xFFFFFFFF)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(12)
        if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
            return None
        pos, frame = 12, 1
        while pos + 8 <= size:
            f.seek(pos)
            chunk, length = struct.unpack("<4sI", f.read(8))
            if chunk == b"fmt " and length >= 14:
                frame = max(1, struct.unpack("<12xH", f.read(14))[0])  # the block align: bytes per frame
            elif chunk == b"data":
                have = size - pos - 8
                if length in (0, 0xFFFFFFFF) or length - have < frame:
                    return None
                return length, have
            pos += 8 + length + (length & 1)
    return None


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


def read_pcm16(path: str, sample_rate: int = 16000) -> Optional[np.ndarray]:
    """A whole 16-bit PCM mono file as its `(samples,)` int16 samples (`read_audio` gives these over 32768), or None
    for a file of another encoding (float, 24-bit): half the memory of float32 for what is held whole."""
    try:
        with sf.SoundFile(path) as f:
            if f.samplerate != sample_rate or f.channels != 1:
                got = f"{f.samplerate} Hz x {f.channels} channels"
                raise AudioError(f"{path}: expected {sample_rate} Hz mono, got {got}")
            return f.read(dtype="int16") if f.subtype == "PCM_16" else None
    except AudioError:
        raise
    except Exception as e:
        raise AudioError(f"{path}: cannot read audio: {e}") from None


def read_segment(path: str, start: int, num_samples: int, sample_rate: int = 16000) -> np.ndarray:
    """Samples [start, start + num_samples) of a mono file: `(num_samples,)` float32, read without
    decoding the rest of the file (soundfile seeks)."""
    try:
        wave, sr = sf.read(path, start=start, frames=num_samples, dtype="float32", always_2d=True)
    except Exception as e:
        raise AudioError(f"{path}: cannot read audio: {e}") from None
    if sr != sample_rate or wave.shape[1] != 1:
        raise AudioError(f"{path}: expected {sample_rate} Hz mono, got {sr} Hz x {wave.shape[1]} channels")
    if wave.shape[0] != num_samples:  # header claimed more frames than the file holds
        raise AudioError(f"{path}: truncated file, read {wave.shape[0]} of {num_samples} samples at {start}")
    return wave[:, 0]


def read_crop(
    path: str, num_samples: int, total: int, rng: np.random.Generator, sample_rate: int = 16000
) -> np.ndarray:
    """A random `(num_samples,)` float32 crop of a file with `total` samples.

    Only the frames of the crop are read from disk (soundfile seeks; no full decode). An utterance
    shorter than the crop is read whole and repeated end-to-end until it fills the crop: this keeps
    the speaker's own signal in every frame, where zero padding would add silence the model never
    sees at test time.
    """
    if total >= num_samples:
        return read_segment(path, int(rng.integers(0, total - num_samples + 1)), num_samples, sample_rate)
    wave = read_audio(path, sample_rate)
    if wave.shape[0] == 0:
        raise AudioError(f"{path}: empty audio file")
    reps = -(-num_samples // wave.shape[0])
    start = int(rng.integers(0, wave.shape[0]))  # random phase of the repetition
    return np.tile(wave, reps + 1)[start : start + num_samples]


FLOAT_SUBTYPES = ("FLOAT", "DOUBLE")


def read_crop_int16(
    path: Union[str, BinaryIO],
    num_samples: int,
    total: int,
    rng: np.random.Generator,
    sample_rate: int = 16000,
    name: Optional[str] = None,
) -> Tuple[np.ndarray, bool]:
    """`read_crop` (same draw, same repetition of short files) as `(num_samples,)` int16, and whether
    the samples were finite.

    PCM files are read as int16 directly, with no float round trip. Float files are read as float32
    and rounded to int16 (clipped to full scale); NaN or inf has no int16 value, so it is reported
    as `finite` False instead, for the training step to turn that row non-finite and name the file.
    `path` may be an open binary file (a tar member's bytes); errors then name `name`.
    """
    label = name or path
    try:
        with sf.SoundFile(path) as f:
            if f.samplerate != sample_rate or f.channels != 1:
                raise AudioError(
                    f"{label}: expected {sample_rate} Hz mono, got {f.samplerate} Hz x {f.channels} channels"
                )
            is_float = f.subtype in FLOAT_SUBTYPES
            dtype = "float32" if is_float else "int16"
            if total >= num_samples:
                start = int(rng.integers(0, total - num_samples + 1))
                f.seek(start)
                wave = f.read(num_samples, dtype=dtype)
                if wave.shape[0] != num_samples:  # header claimed more frames than the file holds
                    raise AudioError(
                        f"{label}: truncated file, read {wave.shape[0]} of {num_samples} samples at {start}"
                    )
            else:
                wave = f.read(dtype=dtype)
                if wave.shape[0] == 0:
                    raise AudioError(f"{label}: empty audio file")
                start = int(rng.integers(0, wave.shape[0]))  # random phase of the repetition
                wave = np.tile(wave, -(-num_samples // wave.shape[0]) + 1)[start : start + num_samples]
    except AudioError:
        raise
    except Exception as e:  # soundfile raises RuntimeError / LibsndfileError subclasses
        raise AudioError(f"{label}: cannot read audio: {e}") from None
    if not is_float:
        return wave, True
    finite = bool(np.isfinite(wave).all())
    wave = np.nan_to_num(wave, nan=0.0, posinf=1.0, neginf=-1.0)
    return np.clip(np.round(wave * 32768.0), -32768, 32767).astype(np.int16), finite
