"""The training step's input pipeline, batched on the training device: loader batch -> (features, labels).

    pipeline = InputPipeline(features, crop_samples, speed_factors=[0.9, 1.1], num_speakers=S)
    feats, labels = pipeline(batch)    # batch: `speakerlab.dataio.loaders.batches.collate`'s, host or device

The loader workers only read int16 audio and draw (speakerlab.dataio.loaders.batches,
speakerlab.dataio.waveform.augment); here,
for the whole batch at once and on whatever device the module sits on (CPU tensors for CPU
training and the tests):

  speed      items grouped by factor, polyphase resampling (speakerlab.dataio.waveform.speed), cut to the crop
  reverb     FFT convolution with each item's RIR, aligned on its direct path, input power kept
  equaliser  each drawn item's random smooth EQ (gains at EQ_HZ), zero phase over the crop, power kept
  additive   segments at equal level, summed per item (babble), scaled to the drawn SNR, added
  features   the front-end module of the run's FeatureSpec (speakerlab.features.spec.build_features):
             Kaldi fbank and per-utterance mean normalisation, or the ReDimNet2 log-mel

The arithmetic is float32 (the float64 per-sample reference, `speakerlab.dataio.waveform.augment.reference_wave`,
agrees to ~1e-5 of full scale). Labels: with speed perturbation as new speakers, speaker index +
factor class x num_speakers (speakerlab.dataio.waveform.speed).
"""

from __future__ import annotations

from functools import partial
from typing import Dict, Optional, Sequence, Tuple

import torch
from torch import Tensor

from speakerlab.dataio.waveform.augment import EQ_HZ, INT16_SCALE
from speakerlab.dataio.waveform.speed import SpeedPerturb, by_rows, speed_labels

CPU_ROWS = 16  # rows per block on a CPU (see speakerlab.dataio.waveform.speed.by_rows); a GPU takes the batch at once


def mean_square(x: Tensor) -> Tensor:
    """`(B, N) -> (B,)` mean square of each row."""
    return x.square().mean(dim=1)


def reverberate_batch(x: Tensor, rirs: Tensor) -> Tensor:
    """`x (R, N)` each convolved with its `rirs (R, L)` row (zero-padded), `(R, N)` out.

    Each output starts at its RIR's direct-path peak (largest |tap|), so the reverberant speech is
    not delayed against the clean crop, and keeps its input's power. An all-zero RIR leaves the row."""
    n, length = x.shape[1], rirs.shape[1]
    size = 1 << (n + length - 2).bit_length()  # power of two >= the full convolution length
    full = torch.fft.irfft(torch.fft.rfft(x, size) * torch.fft.rfft(rirs, size), size)
    peak = rirs.abs().argmax(dim=1, keepdim=True)
    out = torch.gather(full, 1, peak + torch.arange(n, device=x.device))
    pin, pout = mean_square(x), mean_square(out)
    gain = torch.where(pout > 0, (pin / pout.clamp_min(torch.finfo(x.dtype).tiny)).sqrt(), torch.ones_like(pout))
    keep = (rirs != 0).any(dim=1, keepdim=True)
    return torch.where(keep, out * gain.unsqueeze(1), x)


def equalise_batch(x: Tensor, gains_db: Tensor, sample_rate: int) -> Tensor:
    """`x (R, N)` each through its equaliser, `gains_db (R, len(EQ_HZ))` at EQ_HZ, linear in log-frequency between
    them and flat beyond (speakerlab.dataio.waveform.augment.eq_curve), zero phase over the crop: `(R, N)`, each row's
    power kept."""
    n = x.shape[1]
    points = torch.log(torch.tensor(EQ_HZ, dtype=x.dtype, device=x.device))
    at = torch.log(torch.fft.rfftfreq(n, 1.0 / sample_rate, device=x.device).to(x.dtype).clamp_min(EQ_HZ[0]))
    upper = torch.searchsorted(points, at).clamp(1, len(EQ_HZ) - 1)
    w = ((at - points[upper - 1]) / (points[upper] - points[upper - 1])).clamp(0.0, 1.0)
    curve = gains_db[:, upper - 1] * (1.0 - w) + gains_db[:, upper] * w  # (R, F) dB
    y = torch.fft.irfft(torch.fft.rfft(x, dim=1) * torch.pow(10.0, curve / 20.0), n, dim=1)
    px, py = mean_square(x), mean_square(y)
    gain = torch.where(py > 0, (px / py.clamp_min(torch.finfo(x.dtype).tiny)).sqrt(), torch.ones_like(py))
    return y * gain.unsqueeze(1)


def add_noise_batch(x: Tensor, noise: Tensor, owner: Tensor, snr_db: Tensor) -> Tensor:
    """`x (B, N)` plus its segments of `noise (S, N)` (`owner (S,)`: the row of each) at `snr_db (B,)`.

    Segments are first brought to unit power and summed per row (babble talkers at equal level;
    for a single noise or music segment this changes nothing, the SNR gain sets the level). Rows
    without segments, silent rows and silent noise are left unchanged (no SNR is defined then)."""
    if noise.shape[0] == 0:
        return x
    p = mean_square(noise)
    unit = noise / torch.where(p > 0, p, torch.ones_like(p)).sqrt().unsqueeze(1)
    mix = torch.zeros_like(x).index_add_(0, owner, unit)
    px, pn = mean_square(x), mean_square(mix)
    ok = (px > 0) & (pn > 0)
    target = pn * torch.pow(10.0, torch.nan_to_num(snr_db, nan=0.0) / 10.0)
    gain = torch.where(ok, (px / torch.where(ok, target, torch.ones_like(target))).sqrt(), torch.zeros_like(px))
    return x + gain.unsqueeze(1) * mix


class InputPipeline(torch.nn.Module):
    """`forward(batch) -> (feats (B, T, F) float32, labels (B,) int64)`, see the module docstring.

    `features`: wave `(B, samples)` -> model input, from `speakerlab.features.spec.build_features` (with
    the training dither); a feature-store batch only goes through its `normalize`.
    `speed_factors`: the factors the dataset draws from (its classes,
    `speakerlab.dataio.waveform.speed.factor_classes`);
    `num_speakers`: set it when speed-perturbed copies are new speakers (labels are expanded).
    `cpu_rows`: block size of the heavy steps on a CPU (None: whole batch); `sample_rate`: of the crops (the
    equaliser's frequencies)."""

    def __init__(
        self,
        features: torch.nn.Module,
        crop_samples: int,
        speed_factors: Sequence[float] = (),
        num_speakers: Optional[int] = None,
        cpu_rows: Optional[int] = CPU_ROWS,
        sample_rate: int = 16000,
    ):
        super().__init__()
        self.features, self.crop, self.sample_rate = features, int(crop_samples), int(sample_rate)
        # Where this module lives: born where `features` is (a GPU run builds the front end on the card and this
        # module around it), then moved with it by .to(). Not every front end has buffers: then the CPU.
        where = next(iter([*features.parameters(), *features.buffers()]), torch.zeros(0)).device
        self.register_buffer("anchor", torch.zeros(0, device=where), persistent=False)
        self.speed = SpeedPerturb(speed_factors)
        self.num_speakers, self.cpu_rows = num_speakers, cpu_rows

    @property
    def device(self) -> torch.device:
        return self.anchor.device

    def to_device(self, batch: Dict[str, object]) -> Dict[str, object]:
        """The batch's tensors on this module's device (non-blocking from pinned memory)."""
        return {k: v.to(self.device, non_blocking=True) if isinstance(v, Tensor) else v for k, v in batch.items()}

    def waves(self, batch: Dict[str, object]) -> Tensor:
        """The augmented crops `(C x B, crop)` float32, in [-1, 1) scale before augmentation: C = the batch's
        `copies` (1 but for a multi-crop objective), copy-major, each copy of a row with its own augmentation."""
        b = self.to_device(batch)
        chunk = self.cpu_rows if self.device.type == "cpu" else None
        x = self.speed(b["wave"], batch["speed"], self.crop, chunk) * INT16_SCALE  # groups from the host copy
        copies, finite = int(batch.get("copies", 1)), b["finite"]
        if copies > 1:
            x, finite = x.repeat(copies, 1), finite.repeat(copies)
        if b["rir"].shape[0]:
            rows = b["rir_item"]
            x = x.index_copy(0, rows, by_rows(reverberate_batch, chunk, x[rows], b["rir"].float()))
        if "eq" in b and b["eq"].shape[0]:
            rows = b["eq_item"]
            coloured = by_rows(partial(equalise_batch, sample_rate=self.sample_rate), chunk, x[rows], b["eq"])
            x = x.index_copy(0, rows, coloured)
        if b["noise"].shape[0]:
            x = add_noise_batch(x, b["noise"].float(), b["noise_item"], b["snr"])
        # A file with NaN / inf samples (int16 cannot hold them) becomes a non-finite row again, so the
        # training step's guard skips the step and names the file, as with float crops.
        return torch.where(finite.unsqueeze(1), x, torch.full_like(x, float("nan")))

    def forward(self, batch: Dict[str, object]) -> Tuple[Tensor, Tensor]:
        labels = batch["label"].to(self.device, non_blocking=True)
        if "feats" in batch:  # a feature-store batch (speakerlab.features.store): only the normalisation
            return self.features.normalize(batch["feats"].to(self.device, non_blocking=True)), labels
        x = self.waves(batch)
        if self.num_speakers is not None:
            labels = speed_labels(labels, batch["speed"].to(self.device, non_blocking=True), self.num_speakers)
        feats = by_rows(self.features, self.cpu_rows if self.device.type == "cpu" else None, x)  # fp32, no autocast
        return feats, labels
