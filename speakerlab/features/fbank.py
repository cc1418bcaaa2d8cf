"""Kaldi-compatible log-mel filterbank features (``compute-fbank-feats``) in plain PyTorch.

Matches ``torchaudio.compliance.kaldi.fbank`` to 1e-3 on the log values, without torchaudio, for
a whole padded batch at once and on any device (window and mel matrix are module buffers).
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import Tensor

from speakerlab.devices import in_exact_fp32
from speakerlab.frontends import FbankConfig  # its options (the front-end registry's settings of kaldi_fbank)

FLT_EPSILON = torch.finfo(torch.float32).eps  # Kaldi's floor of energies before the log, in any dtype


def num_frames(num_samples: int, config: FbankConfig) -> int:
    """Number of frames Kaldi produces for ``num_samples`` samples (0 when too short)."""
    size, shift = config.window_size, config.window_shift
    if config.snip_edges:
        return 0 if num_samples < size else 1 + (num_samples - size) // shift
    # Without snipping, frames are centred on multiples of the shift and the wave is mirrored.
    return (num_samples + shift // 2) // shift


def _frame_counts(lengths: Tensor, config: FbankConfig) -> Tensor:
    size, shift = config.window_size, config.window_shift
    if config.snip_edges:
        return torch.where(lengths >= size, torch.div(lengths - size, shift, rounding_mode="floor") + 1, 0)
    return torch.div(lengths + shift // 2, shift, rounding_mode="floor")


def _mel_matrix(config: FbankConfig, dtype: torch.dtype = torch.float32) -> Tensor:
    """Triangular filters on the mel scale, (fft_size // 2, num_mel_bins) in `dtype`.

    Built in float32 as Kaldi's MelBanks (BaseFloat) and torchaudio do: the rounding of the
    filter edges shows in the narrow low-frequency filters at the 1e-4 level.
    """

    def mel(freq):
        return 1127.0 * (1.0 + freq / 700.0).log()

    lo = 1127.0 * math.log(1.0 + config.low_freq / 700.0)
    hi = 1127.0 * math.log(1.0 + config.effective_high_freq / 700.0)
    delta = (hi - lo) / (config.num_mel_bins + 1)
    index = torch.arange(config.num_mel_bins, dtype=dtype)
    left, center, right = lo + index * delta, lo + (index + 1.0) * delta, lo + (index + 2.0) * delta
    # Kaldi's filters cover FFT bins 0 .. N/2 - 1: the Nyquist bin never contributes.
    bin_width = config.sample_rate / config.fft_size
    bin_mel = mel(bin_width * torch.arange(config.fft_size // 2, dtype=dtype)).unsqueeze(1)
    up = (bin_mel - left) / (center - left)
    down = (right - bin_mel) / (right - center)
    return torch.minimum(up, down).clamp_min(0.0)


def _window(kind: str, size: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """Kaldi's symmetric analysis windows (denominator size - 1), (size,) in `dtype`.

    Computed in float32 with torch's window functions, as torchaudio does, not in float64 and
    rounded as Kaldi does. This is not cosmetic: after pre-emphasis the lowest mel bins of a loud
    frame sit 55-85 dB below its energy, so one-ulp window differences move them by up to 4e-3
    in log. The float32 reference is itself that noisy there (a float64 pipeline lands 3e-3 off
    it), so parity comes from rounding alike, not from more precision.
    """
    if kind == "hanning":
        return torch.hann_window(size, periodic=False, dtype=dtype)
    if kind == "hamming":
        return torch.hamming_window(size, periodic=False, alpha=0.54, beta=0.46, dtype=dtype)
    if kind == "povey":  # Dan Povey's window: a Hann window raised to 0.85, zero at both ends
        return torch.hann_window(size, periodic=False, dtype=dtype).pow(0.85)
    return torch.ones(size, dtype=dtype)


class Fbank(torch.nn.Module):
    """Batched Kaldi log-mel filterbank: ``Fbank(config=None, dtype=torch.float32, **overrides)``.

    ``forward(wave, lengths=None, *, generator=None)``: ``wave`` (B, samples) of real or integer
    samples (scale them yourself: Kaldi recipes feed int16 values, 3D-Speaker feeds samples/32768)
    -> (B, frames, num_mel_bins [+1 with use_energy, log energy first]) float32. With ``lengths``
    (B,) valid sample counts of a right-padded batch it returns ``(feats, frame_counts)`` and
    the frames past each count are zero; every valid frame equals the single-utterance result.
    Dither is Kaldi's: applied whenever ``dither > 0``, train or eval, drawn from ``generator``
    (which must live on the wave's device) when given.

    ``dtype`` float64 computes everything, window and mel filters included, in float64 (features come
    back in float64): the arithmetic of float64 references (to 1e-6 where float32 gets 1e-4).
    """

    def __init__(self, config: FbankConfig | None = None, dtype: torch.dtype = torch.float32, **overrides) -> None:
        super().__init__()
        self.config = dataclasses.replace(config or FbankConfig(), **overrides)
        window = _window(self.config.window_type, self.config.window_size, dtype)
        self.register_buffer("window", window, persistent=False)
        self.register_buffer("mel", _mel_matrix(self.config, dtype), persistent=False)

    def extra_repr(self) -> str:
        return repr(self.config)

    def _frames(self, wave: Tensor, lengths: Tensor | None) -> Tensor:
        cfg = self.config
        size, shift = cfg.window_size, cfg.window_shift
        if not cfg.snip_edges:
            # Frame f starts at f*shift + shift//2 - size//2; samples outside [0, n) of each
            # utterance are mirrored (s -> -s-1, n+k -> n-1-k), repeatedly for tiny waves: one
            # index gather of the whole padded batch, then the same strided view as below.
            total = wave.shape[1]
            n = (lengths if lengths is not None else torch.tensor([total], device=wave.device)).unsqueeze(1)
            span = (num_frames(total, cfg) - 1) * shift + size
            pos = torch.arange(span, device=wave.device) - (size // 2 - shift // 2)
            pos = torch.remainder(pos, 2 * n)
            pos = torch.where(pos >= n, 2 * n - 1 - pos, pos)
            wave = torch.gather(wave, 1, pos.expand(wave.shape[0], -1))
        return wave.unfold(1, size, shift)

    def _log_energy(self, frames: Tensor) -> Tensor:
        eps = FLT_EPSILON
        energy = frames.square().sum(-1).clamp_min(eps).log()
        if self.config.energy_floor > 0.0:
            energy = energy.clamp_min(math.log(self.config.energy_floor))
        return energy

    @in_exact_fp32  # TF32 (hardware.tf32) would cost ~1e-3 in log-mel: features are the same everywhere
    def forward(
        self, wave: Tensor, lengths: Tensor | None = None, *, generator: torch.Generator | None = None
    ) -> Tensor | tuple[Tensor, Tensor]:
        cfg = self.config
        if wave.dim() != 2:
            raise ValueError(f"Fbank expects wave of shape (batch, samples), got {tuple(wave.shape)}")
        wave = wave.to(self.window.dtype)
        total = wave.shape[1]
        if num_frames(total, cfg) < 1:
            raise ValueError(
                f"wave of {total} samples is too short for one frame of {cfg.window_size} samples "
                f"(snip_edges={cfg.snip_edges})"
            )
        counts = None
        if lengths is not None:
            lengths = torch.as_tensor(lengths, device=wave.device).long()
            if lengths.shape != (wave.shape[0],):
                raise ValueError(f"lengths must have shape ({wave.shape[0]},), got {tuple(lengths.shape)}")
            counts = _frame_counts(lengths, cfg)
            if bool((lengths > total).any()) or bool((counts < 1).any()):
                raise ValueError(
                    f"every length must be <= {total} samples and give at least one frame of "
                    f"{cfg.window_size} samples; got {lengths.tolist()}"
                )

        frames = self._frames(wave, lengths)  # (B, F, window_size)
        if cfg.dither > 0.0:
            noise = torch.randn(frames.shape, generator=generator, device=frames.device, dtype=frames.dtype)
            frames = frames + cfg.dither * noise
        if cfg.remove_dc_offset:
            frames = frames - frames.mean(-1, keepdim=True)
        if cfg.use_energy and cfg.raw_energy:  # Kaldi's raw energy: before pre-emphasis and window
            energy = self._log_energy(frames)
        if cfg.preemphasis != 0.0:
            # Per frame, not across frames; Kaldi treats the sample before the first as itself.
            previous = torch.cat([frames[..., :1], frames[..., :-1]], dim=-1)
            frames = frames - cfg.preemphasis * previous
        frames = frames * self.window
        if cfg.use_energy and not cfg.raw_energy:
            energy = self._log_energy(frames)

        spectrum = torch.fft.rfft(frames, n=cfg.fft_size)  # zero-pads to the power of two
        power = spectrum.real.square() + spectrum.imag.square()
        # Callers may sit in autocast: a half-precision matmul here would cost ~1e-2 in log.
        with torch.autocast(power.device.type, enabled=False):
            mel = power[..., : cfg.fft_size // 2] @ self.mel
        feats = mel.clamp_min(FLT_EPSILON).log()
        if cfg.use_energy:
            feats = torch.cat([energy.unsqueeze(-1), feats], dim=-1)
        if counts is None:
            return feats
        valid = torch.arange(feats.shape[1], device=feats.device) < counts.unsqueeze(1)
        return feats.masked_fill(~valid.unsqueeze(-1), 0.0), counts


def fbank(wave: Tensor, *, generator: torch.Generator | None = None, **overrides) -> Tensor:
    """One-off features: (samples,) -> (frames, bins) or (B, samples) -> (B, frames, bins).

    ``overrides`` are :class:`FbankConfig` fields. Builds a fresh :class:`Fbank` each call; keep
    a module around in loops.
    """
    wave = torch.as_tensor(wave)
    if wave.dim() not in (1, 2):
        raise ValueError(f"fbank expects (samples,) or (batch, samples), got {tuple(wave.shape)}")
    module = Fbank(**overrides).to(wave.device)
    feats = module(wave.unsqueeze(0) if wave.dim() == 1 else wave, generator=generator)
    return feats[0] if wave.dim() == 1 else feats


def mean_normalize(feats: Tensor, num_frames: Tensor | None = None) -> Tensor:
    """Subtract each utterance's mean over frames: (B, frames, D) or (frames, D), same shape out.

    With ``num_frames`` (B,) only the first ``num_frames[b]`` frames count towards the mean and
    the padded frames come back as zeros.
    """
    if feats.dim() not in (2, 3):
        raise ValueError(f"mean_normalize expects (B, frames, D) or (frames, D), got {tuple(feats.shape)}")
    if num_frames is None:
        return feats - feats.mean(dim=-2, keepdim=True)
    if feats.dim() != 3 or num_frames.shape != (feats.shape[0],):
        raise ValueError(f"num_frames {tuple(num_frames.shape)} does not fit feats {tuple(feats.shape)}")
    counts = num_frames.to(feats.device)
    mask = (torch.arange(feats.shape[1], device=feats.device) < counts.unsqueeze(1)).unsqueeze(-1)
    mask = mask.to(feats.dtype)
    mean = (feats * mask).sum(dim=1, keepdim=True) / counts.clamp_min(1).to(feats.dtype).view(-1, 1, 1)
    return (feats - mean) * mask
