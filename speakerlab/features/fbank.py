"""Kaldi-compatible log-mel filterbank features (``compute-fbank-feats``) in plain PyTorch.

Matches ``torchaudio.compliance.kaldi.fbank`` to 1e-3 on the log values, without torchaudio, for
a whole padded batch at once and on any device (window and mel matrix are module buffers).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, Optional

import torch
from torch import Tensor

from speakerlab.devices import in_exact_fp32

if TYPE_CHECKING:  # annotation only: features never needs the config module at run time
    from speakerlab.config import FeatureSettings

WINDOW_TYPES = ("povey", "hamming", "hanning", "rectangular")


@dataclass(frozen=True)
class FbankConfig:
    """Options of Kaldi's ``FbankOptions`` (names follow torchaudio where they differ).

    ``high_freq`` <= 0 is an offset from Nyquist (0 means Nyquist). ``energy_floor`` only acts
    when ``use_energy`` is set and is ignored when <= 0, as in Kaldi.
    """

    sample_rate: int = 16000
    num_mel_bins: int = 80
    frame_length_ms: float = 25.0
    frame_shift_ms: float = 10.0
    window_type: str = "povey"
    preemphasis: float = 0.97
    remove_dc_offset: bool = True
    dither: float = 0.0
    energy_floor: float = 1.0
    use_energy: bool = False
    raw_energy: bool = True
    low_freq: float = 20.0
    high_freq: float = 0.0
    snip_edges: bool = True
    round_to_power_of_two: bool = True

    @property
    def window_size(self) -> int:
        # Kaldi's own order of operations, truncated: samp_freq * 0.001 * frame_length_ms.
        return int(self.sample_rate * 0.001 * self.frame_length_ms)

    @property
    def window_shift(self) -> int:
        return int(self.sample_rate * 0.001 * self.frame_shift_ms)

    @property
    def fft_size(self) -> int:
        n = self.window_size
        return 1 << (n - 1).bit_length() if self.round_to_power_of_two else n

    @property
    def effective_high_freq(self) -> float:
        return self.high_freq if self.high_freq > 0 else 0.5 * self.sample_rate + self.high_freq

    def __post_init__(self) -> None:
        nyquist = 0.5 * self.sample_rate
        checks = {
            f"window_type must be one of {WINDOW_TYPES}": self.window_type in WINDOW_TYPES,
            "num_mel_bins must be >= 3": self.num_mel_bins >= 3,
            "frames need >= 2 samples and a shift >= 1 sample": self.sample_rate > 0
            and self.window_size >= 2
            and self.window_shift >= 1,
            "preemphasis must lie in [0, 1]": 0.0 <= self.preemphasis <= 1.0,
            "dither must be >= 0": self.dither >= 0.0,
            f"need 0 <= low_freq < high_freq <= Nyquist ({nyquist} Hz)": 0.0
            <= self.low_freq
            < self.effective_high_freq
            <= nyquist,
        }
        problems = [message for message, ok in checks.items() if not ok]
        if problems:
            raise ValueError(f"invalid {self}: " + "; ".join(problems))


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


def _mel_matrix(config: FbankConfig) -> Tensor:
    """Triangular filters on the mel scale, (fft_size // 2, num_mel_bins) float32.

    Built in float32 as Kaldi's MelBanks (BaseFloat) and torchaudio do: the rounding of the
    filter edges shows in the narrow low-frequency filters at the 1e-4 level.
    """

    def mel(freq):
        return 1127.0 * (1.0 + freq / 700.0).log()

    lo = 1127.0 * math.log(1.0 + config.low_freq / 700.0)
    hi = 1127.0 * math.log(1.0 + config.effective_high_freq / 700.0)
    delta = (hi - lo) / (config.num_mel_bins + 1)
    index = torch.arange(config.num_mel_bins, dtype=torch.float32)
    left, center, right = lo + index * delta, lo + (index + 1.0) * delta, lo + (index + 2.0) * delta
    # Kaldi's filters cover FFT bins 0 .. N/2 - 1: the Nyquist bin never contributes.
    bin_width = config.sample_rate / config.fft_size
    bin_mel = mel(bin_width * torch.arange(config.fft_size // 2, dtype=torch.float32)).unsqueeze(1)
    up = (bin_mel - left) / (center - left)
    down = (right - bin_mel) / (right - center)
    return torch.minimum(up, down).clamp_min(0.0)


def _window(kind: str, size: int) -> Tensor:
    """Kaldi's symmetric analysis windows (denominator size - 1), (size,) float32.

    Computed in float32 with torch's window functions, as torchaudio does, not in float64 and
    rounded as Kaldi does. This is not cosmetic: after pre-emphasis the lowest mel bins of a loud
    frame sit 55-85 dB below its energy, so one-ulp window differences move them by up to 4e-3
    in log. The float32 reference is itself that noisy there (a float64 pipeline lands 3e-3 off
    it), so parity comes from rounding alike, not from more precision.
    """
    if kind == "hanning":
        return torch.hann_window(size, periodic=False, dtype=torch.float32)
    if kind == "hamming":
        return torch.hamming_window(size, periodic=False, alpha=0.54, beta=0.46, dtype=torch.float32)
    if kind == "povey":  # Dan Povey's window: a Hann window raised to 0.85, zero at both ends
        return torch.hann_window(size, periodic=False, dtype=torch.float32).pow(0.85)
    return torch.ones(size, dtype=torch.float32)


class Fbank(torch.nn.Module):
    """Batched Kaldi log-mel filterbank: ``Fbank(config=None, **overrides)``.

    ``forward(wave, lengths=None, *, generator=None)``: ``wave`` (B, samples) of real or integer
    samples (scale them yourself: Kaldi recipes feed int16 values, 3D-Speaker feeds samples/32768)
    -> (B, frames, num_mel_bins [+1 with use_energy, log energy first]) float32. With ``lengths``
    (B,) valid sample counts of a right-padded batch it returns ``(feats, frame_counts)`` and
    the frames past each count are zero; every valid frame equals the single-utterance result.
    Dither is Kaldi's: applied whenever ``dither > 0``, train or eval, drawn from ``generator``
    (which must live on the wave's device) when given.
    """

    def __init__(self, config: FbankConfig | None = None, **overrides) -> None:
        super().__init__()
        self.config = dataclasses.replace(config or FbankConfig(), **overrides)
        window = _window(self.config.window_type, self.config.window_size)
        self.register_buffer("window", window, persistent=False)
        self.register_buffer("mel", _mel_matrix(self.config), persistent=False)

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
        eps = torch.finfo(frames.dtype).eps
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
        feats = mel.clamp_min(torch.finfo(mel.dtype).eps).log()
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


@dataclass(frozen=True)
class FeatureSpec:
    """What an embedding model expects from audio: Kaldi fbank settings (sample rate included, dither
    0) and per-utterance mean normalisation. Stored as plain values in every checkpoint, so inference
    rebuilds the exact front-end without the training config."""

    fbank: FbankConfig = FbankConfig()
    mean_norm: bool = True

    @property
    def sample_rate(self) -> int:
        return self.fbank.sample_rate

    @property
    def feat_dim(self) -> int:
        return self.fbank.num_mel_bins

    def to_dict(self) -> Dict[str, Any]:
        return {"fbank": dataclasses.asdict(self.fbank), "mean_norm": self.mean_norm}

    @classmethod
    def from_dict(cls, raw: Dict[str, Any]) -> "FeatureSpec":
        known = {f.name for f in dataclasses.fields(FbankConfig)}
        unknown = sorted(set(raw["fbank"]) - known)
        if unknown:
            raise ValueError(f"unknown fbank setting(s) {unknown}")
        return cls(FbankConfig(**raw["fbank"]), bool(raw["mean_norm"]))


def fbank_config(settings: "FeatureSettings", sample_rate: int, dither: Optional[float] = None) -> FbankConfig:
    """The fbank of a `features` config section at `sample_rate`; `dither` overrides the section's
    (inference always uses 0)."""
    return FbankConfig(
        sample_rate=sample_rate,
        num_mel_bins=settings.num_mel_bins,
        frame_length_ms=settings.frame_length_ms,
        frame_shift_ms=settings.frame_shift_ms,
        window_type=settings.window_type,
        dither=settings.dither if dither is None else dither,
    )


def feature_spec(settings: "FeatureSettings", sample_rate: int) -> FeatureSpec:
    """The inference front-end (no dither) of a `features` config section."""
    return FeatureSpec(fbank_config(settings, sample_rate, dither=0.0), settings.mean_norm)


def compute_features(fbank: Fbank, waves: Tensor, mean_norm: bool) -> Tensor:
    """`(B, samples)` fp32 waves -> `(B, frames, bins)` fp32 features. Called outside autocast on
    purpose: log-mel energies in bf16 lose the small differences the model learns from."""
    feats = fbank(waves)
    return mean_normalize(feats) if mean_norm else feats
