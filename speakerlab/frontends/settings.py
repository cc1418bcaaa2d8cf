"""The settings of each front-end kind: what a checkpoint stores of it (`FeatureSpec.config`), with each
kind's own checks and its width (`feat_dim`, values per frame of the model input). Torch-free, as the whole
registry (speakerlab.frontends); the modules that compute them live in speakerlab.features."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Union

WINDOW_TYPES = ("povey", "hamming", "hanning", "rectangular")


def _invalid(settings: Any, checks: Dict[str, bool]) -> None:
    problems = [message for message, ok in checks.items() if not ok]
    if problems:
        raise ValueError(f"invalid {settings}: " + "; ".join(problems))


def pow2(n: int) -> int:
    """The smallest power of two >= n (an FFT size)."""
    return 1 << (n - 1).bit_length()


@dataclass(frozen=True)
class FbankConfig:
    """Options of Kaldi's `FbankOptions` (names follow torchaudio where they differ).

    `high_freq` <= 0 is an offset from Nyquist (0 means Nyquist). `energy_floor` only acts when `use_energy` is
    set and is ignored when <= 0, as in Kaldi."""

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
        return pow2(self.window_size) if self.round_to_power_of_two else self.window_size

    @property
    def effective_high_freq(self) -> float:
        return self.high_freq if self.high_freq > 0 else 0.5 * self.sample_rate + self.high_freq

    @property
    def feat_dim(self) -> int:
        return self.num_mel_bins + int(self.use_energy)

    def __post_init__(self) -> None:
        nyquist = 0.5 * self.sample_rate
        _invalid(
            self,
            {
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
            },
        )


@dataclass(frozen=True)
class ReDimNetMelConfig:
    """The settings of the ReDimNet2 releases' log-mel (`speakerlab.features.redimnet.ReDimNetMel`); the defaults
    are the releases' (`TFMelBanks(n_mels=72, hop_length=160, do_preemph=True, norm_signal=True)`)."""

    sample_rate: int = 16000
    n_mels: int = 72
    n_fft: int = 512
    win_length: int = 400
    hop_length: int = 160
    f_min: float = 20.0
    f_max: float = 7600.0
    preemphasis: float = 0.97
    normalize_signal: bool = True

    @property
    def feat_dim(self) -> int:
        return self.n_mels

    def __post_init__(self) -> None:
        _invalid(
            self,
            {
                "n_mels must be >= 1": self.n_mels >= 1,
                "need 2 <= win_length <= n_fft": 2 <= self.win_length <= self.n_fft,
                "hop_length must be >= 1": self.hop_length >= 1,
                "preemphasis must lie in [0, 1]": 0.0 <= self.preemphasis <= 1.0,
                f"need 0 <= f_min < f_max <= Nyquist ({self.sample_rate / 2:g} Hz)": 0.0
                <= self.f_min
                < self.f_max
                <= self.sample_rate / 2,
            },
        )


@dataclass(frozen=True)
class WaveformConfig:
    """The settings of the waveform front-end (self-supervised encoders that take the wave itself)."""

    sample_rate: int = 16000

    @property
    def feat_dim(self) -> int:
        return 1

    def __post_init__(self) -> None:
        _invalid(self, {"sample_rate must be >= 1000": self.sample_rate >= 1000})


@dataclass(frozen=True)
class W2VBertFbankConfig:
    """The settings of w2v-BERT 2.0's input features (its own are the defaults)."""

    sample_rate: int = 16000
    num_mel_bins: int = 80
    stride: int = 2  # frames stacked into one model input frame

    @property
    def feat_dim(self) -> int:
        return self.num_mel_bins * self.stride

    def __post_init__(self) -> None:
        _invalid(self, {"stride must be >= 1": self.stride >= 1})
        FbankConfig(sample_rate=self.sample_rate, num_mel_bins=self.num_mel_bins)  # its own checks


FrontEndConfig = Union[FbankConfig, ReDimNetMelConfig, WaveformConfig, W2VBertFbankConfig]
