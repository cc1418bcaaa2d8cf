"""Log-mel front-end of the ReDimNet2 releases (the official `TFMelBanks`, `feat_type="tf"`), in plain PyTorch.

    wave (B, samples) at 16 kHz -> ReDimNetMel() -> (B, frames, 72) -> speakerlab ReDimNet2 -> (B, 192)

Reproduces the official features to 1e-3 on the log values without torchaudio or scipy. Unlike
the Kaldi `Fbank` (speakerlab/features/fbank.py) it normalises the waveform, pads frames at both ends,
uses an HTK mel scale with a quirky bin-frequency grid and subtracts the utterance mean per bin.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import Tensor

from speakerlab.frontends import ReDimNetMelConfig


def _hz_to_mel(hz: Tensor) -> Tensor:
    return 2595.0 * torch.log10(1.0 + hz / 700.0)


def redimnet_mel_matrix(
    n_mels: int = 72, n_bins: int = 256, sample_rate: int = 16000, f_min: float = 20.0, f_max: float = 7600.0
) -> Tensor:
    """Mel weights `(n_bins, n_mels)` float32: HTK-mel triangles with peak 1, no area normalisation.

    Edges are evenly spaced in mel from `f_min` to `f_max`. As in the released front-end, spectrum
    bin j (1 .. n_bins-1) is taken to sit at `(sample_rate / 2) * j / (n_bins - 1)` Hz (a grid of
    n_bins points over 0 .. Nyquist, not the FFT's `sample_rate * j / n_fft`), and bin 0 gets
    weight 0. Built in float64, rounded once.
    """
    edges = torch.linspace(
        _hz_to_mel(torch.tensor(f_min, dtype=torch.float64)).item(),
        _hz_to_mel(torch.tensor(f_max, dtype=torch.float64)).item(),
        n_mels + 2,
        dtype=torch.float64,
    )
    left, center, right = edges[:-2], edges[1:-1], edges[2:]
    bins = _hz_to_mel(torch.linspace(0.0, sample_rate / 2, n_bins, dtype=torch.float64))[1:].unsqueeze(1)
    rising = (bins - left) / (center - left)
    falling = (right - bins) / (right - center)
    weights = torch.minimum(rising, falling).clamp_min(0.0)
    return torch.cat([torch.zeros(1, n_mels, dtype=torch.float64), weights]).float()


class ReDimNetMel(torch.nn.Module):
    """ReDimNet2 log-mel features: wave `(B, samples)` or `(samples,)` -> `(B, frames, n_mels)` float32.

    Per utterance (row): `(x - mean) / (std + 1e-8)` (biased std) when `normalize_signal`;
    pre-emphasis `y[n] = x[n] - 0.97 x[n-1]` with `y[0] = x[0] - 0.97 x[1]`; 400-sample frames every
    `hop_length`, the wave zero-padded by `hop_length // 2` at both ends, so
    `frames = (samples - 240) // 160 + 1`; symmetric Hamming window; power spectrum of the frame
    zero-padded to `n_fft`, bins 0 .. n_fft/2 - 1 (Nyquist dropped), clipped to [1e-8, 1e8]; mel
    weights (`redimnet_mel_matrix`), clipped likewise; `log(mel + 1e-8)`; minus each bin's mean over
    the utterance's frames (when `mean_norm`). The released checkpoints use the defaults.

    Every row is one whole utterance: the normalisations are over the full row, so right-padded
    batches of different lengths do not give each utterance's own features.
    """

    def __init__(
        self,
        n_mels: int = 72,
        sample_rate: int = 16000,
        n_fft: int = 512,
        win_length: int = 400,
        hop_length: int = 160,
        f_min: float = 20.0,
        f_max: float = 7600.0,
        preemphasis: float = 0.97,
        normalize_signal: bool = True,
        mean_norm: bool = True,
        eps: float = 1e-8,
    ):
        super().__init__()
        if win_length > n_fft:
            raise ValueError(f"win_length {win_length} exceeds n_fft {n_fft}")
        self.n_mels = n_mels
        self.n_fft = n_fft
        self.win_length = win_length
        self.hop_length = hop_length
        self.preemphasis = preemphasis
        self.normalize_signal = normalize_signal
        self.mean_norm = mean_norm
        self.eps = eps
        n = torch.arange(win_length, dtype=torch.float64)
        window = 0.54 - 0.46 * torch.cos(2.0 * math.pi * n / (win_length - 1))
        self.register_buffer("window", window.float(), persistent=False)
        mel = redimnet_mel_matrix(n_mels, n_fft // 2, sample_rate, f_min, f_max)
        self.register_buffer("mel", mel, persistent=False)

    def num_frames(self, num_samples: int) -> int:
        """Frames produced for `num_samples` samples."""
        return (num_samples + 2 * (self.hop_length // 2) - self.win_length) // self.hop_length + 1

    def batch_length(self, num_samples: int) -> int:
        """Waves batch (shorter ones repeated) without changing their features only at equal sample
        counts: the signal normalisation spans the whole row."""
        return num_samples

    def forward(self, wave: Tensor) -> Tensor:
        if wave.dim() == 1:
            return self.forward(wave.unsqueeze(0))[0]
        if wave.dim() != 2:
            raise ValueError(f"ReDimNetMel expects (batch, samples) or (samples,), got {tuple(wave.shape)}")
        if self.num_frames(wave.shape[1]) < 1:
            raise ValueError(f"wave of {wave.shape[1]} samples is too short for one frame")
        # Callers may sit in autocast: half precision would cost far more than the 1e-3 budget.
        with torch.autocast(wave.device.type, enabled=False):
            x = wave.float()
            if self.normalize_signal:
                std, mean = torch.std_mean(x, dim=1, correction=0, keepdim=True)
                x = (x - mean) / (std + self.eps)
            if self.preemphasis:
                first = x[:, :1] - self.preemphasis * x[:, 1:2]  # the sample before x[0] is x[1] (reflection)
                x = torch.cat([first, x[:, 1:] - self.preemphasis * x[:, :-1]], dim=1)
            pad = self.hop_length // 2
            frames = F.pad(x, (pad, pad)).unfold(1, self.win_length, self.hop_length) * self.window
            spectrum = torch.fft.rfft(frames, n=self.n_fft)[..., : self.n_fft // 2]
            power = (spectrum.real.square() + spectrum.imag.square()).clamp(self.eps, 1.0 / self.eps)
            mel = torch.matmul(power, self.mel).clamp(self.eps, 1.0 / self.eps)
            feats = torch.log(mel + self.eps)
            return feats - feats.mean(dim=1, keepdim=True) if self.mean_norm else feats


def mel_features(config: ReDimNetMelConfig, mean_norm: bool) -> ReDimNetMel:
    """The redimnet_mel front-end of a spec (speakerlab.frontends)."""
    return ReDimNetMel(**dataclasses.asdict(config), mean_norm=mean_norm)


# A release's `model_config` builds its front-end as `TFMelBanks(n_mels=F, hop_length=hop_length,
# **spec_params)`; these `spec_params` map onto ReDimNetMelConfig, with the official constructor's
# defaults where a config leaves one out. SpecAugment settings act in training only.
_SPEC_PARAMS = {"sample_rate", "n_fft", "win_length", "f_min", "f_max", "do_preemph", "norm_signal", "eps"}
_SPEC_AUGMENT = {"do_spec_aug", "freq_start_bin", "freq_mask_width", "time_mask_width"}


def release_mel_config(model_config: dict) -> ReDimNetMelConfig:
    """The front-end settings of a released ReDimNet2 (`{"model_config": ..., "state_dict": ...}` of
    PalabraAI/redimnet2); a ValueError names a setting this front-end cannot reproduce."""
    feat_type = model_config.get("feat_type", "pt")
    if feat_type not in ("tf", "tf_mel"):
        raise ValueError(
            f"ReDimNet2 model_config feat_type={feat_type!r}: only the releases' 'tf' front-end is reproduced"
        )
    params = dict(model_config.get("spec_params") or {})
    unknown = sorted(set(params) - _SPEC_PARAMS - _SPEC_AUGMENT)
    if unknown:
        raise ValueError(f"ReDimNet2 model_config spec_params has unknown setting(s) {unknown}")
    if params.get("eps", 1e-8) != 1e-8:
        raise ValueError(f"ReDimNet2 model_config spec_params eps={params['eps']!r} is not supported (only 1e-8)")
    return ReDimNetMelConfig(
        sample_rate=int(params.get("sample_rate", 16000)),
        n_mels=int(model_config.get("F", 72)),
        n_fft=int(params.get("n_fft", 512)),
        win_length=int(params.get("win_length", 400)),
        hop_length=int(model_config.get("hop_length", 160)),
        f_min=float(params.get("f_min", 20.0)),
        f_max=float(params.get("f_max", 7600.0)),
        preemphasis=0.97 if params.get("do_preemph", True) else 0.0,
        normalize_signal=bool(params.get("norm_signal", False)),
    )
