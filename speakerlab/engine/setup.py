"""Building a training run's parts from the config: data, features, model + classifier, optimizer,
batch plan, and restoring them from a checkpoint."""
from __future__ import annotations

import random
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np
import torch
import torch.nn as nn

from speakerlab.augment import Augmenter
from speakerlab.batches import CropDataset, GlobalBatchSampler
from speakerlab.config import Config
from speakerlab.engine.batch_plan import BatchPlan, find_max_batch, plan_batches
from speakerlab.engine.distributed import DistInfo
from speakerlab.features import Fbank, FbankConfig, mean_normalize
from speakerlab.lists import DataDir, ListError, load_data_dir
from speakerlab.prepare import index_lengths
from speakerlab.loss import AAMSoftmax, SphereFace2
from speakerlab.models import build_model


class SpeakerNet(nn.Module):
    """Features -> embedding model -> AAM classifier, as one module so DDP sees every parameter.

    `forward(feats (B, T, F), labels (B,)) -> (loss, cosine logits (B, S))`; autocast applies to the
    embedding model only: the classifier computes in fp32.
    """

    def __init__(self, model: nn.Module, classifier: AAMSoftmax, autocast: Callable):
        super().__init__()
        self.model, self.classifier, self._autocast = model, classifier, autocast

    def forward(self, feats: torch.Tensor, labels: torch.Tensor):
        with self._autocast():
            emb = self.model(feats)
        return self.classifier(emb, labels)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def load_train_data(cfg: Config, log: Callable[[str], None]) -> DataDir:
    """Validated training lists, every listed file present (all missing ones reported), lengths known.

    Lengths come from `utt2num_samples` (the prepare stage, which also checked every header). Headers
    are read again only when that index is missing or `data.check_audio` asks for it: on a corpus of
    a million files that is minutes at every start."""
    data = load_data_dir(cfg.data.train)
    data.check_audio_exists()
    if not data.num_samples or cfg.data.check_audio:
        lengths = index_lengths(data, cfg.data.sample_rate)
        stale = [u for u in data.num_samples if data.num_samples[u] != lengths[u]]
        if stale:
            raise ListError(f"{data.root / 'utt2num_samples'}: '{stale[0]}' says {data.num_samples[stale[0]]} samples, "
                            f"the file has {lengths[stale[0]]} ({len(stale)} stale); re-run the prepare stage")
        data.num_samples = lengths
    log(f"training data {data.root}: {len(data.utts)} utterances, {len(data.speakers)} speakers")
    return data


def build_augmenter(cfg: Config, log: Callable[[str], None]) -> Optional[Augmenter]:
    """The training augmenter of `cfg.augment` (its lists checked now, every problem reported at
    once), or None when `augment.lists` is not set. Validation and extraction never augment."""
    a = cfg.augment
    if not a.lists:
        log("augmentation off (augment.lists not set)")
        return None
    aug = Augmenter(a.lists, a.prob, a.kinds, {"noise": a.noise_snr, "music": a.music_snr, "babble": a.babble_snr},
                    a.babble_speakers, cfg.data.sample_rate, a.reverb_noise_prob)
    log(aug.describe())
    return aug


def make_fbank(cfg: Config, device: torch.device, dither: Optional[float] = None) -> Fbank:
    f = cfg.features
    fb = FbankConfig(sample_rate=cfg.data.sample_rate, num_mel_bins=f.num_mel_bins,
                     frame_length_ms=f.frame_length_ms, frame_shift_ms=f.frame_shift_ms,
                     window_type=f.window_type, dither=f.dither if dither is None else dither)
    return Fbank(fb).to(device)


def compute_features(fbank: Fbank, waves: torch.Tensor, mean_norm: bool) -> torch.Tensor:
    """`(B, samples)` fp32 waves -> `(B, frames, bins)` fp32 features (outside autocast on purpose)."""
    feats = fbank(waves)
    return mean_normalize(feats) if mean_norm else feats


def build_net(cfg: Config, num_speakers: int, autocast: Callable) -> SpeakerNet:
    model = build_model(cfg.model.name, **cfg.model.args)
    with torch.no_grad():
        dim = model.eval()(torch.zeros(1, 200, cfg.features.num_mel_bins)).shape[-1]
    model.train()
    if cfg.loss.name == "sphereface2":
        classifier = SphereFace2(dim, num_speakers, scale=cfg.loss.scale, margin=0.0,
                                 lam=cfg.loss.sphereface2_lambda, t=cfg.loss.sphereface2_t)
    else:
        classifier = AAMSoftmax(dim, num_speakers, scale=cfg.loss.scale, margin=0.0)
    return SpeakerNet(model, classifier, autocast)


def build_optimizer(cfg: Config, net: nn.Module) -> torch.optim.Optimizer:
    # No weight decay on norms and biases: decaying BN scales toward 0 only fights the normalisation.
    decay, no_decay = [], []
    for p in net.parameters():
        if p.requires_grad:
            (no_decay if p.ndim <= 1 else decay).append(p)
    o = cfg.optim
    groups = [{"params": decay, "weight_decay": o.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if o.name == "adam":
        return torch.optim.Adam(groups, lr=o.lr)
    if o.name == "adamw":
        return torch.optim.AdamW(groups, lr=o.lr)
    return torch.optim.SGD(groups, lr=o.lr, momentum=o.momentum, nesterov=o.nesterov)


def make_loader(cfg: Config, data: DataDir, spk2idx: Dict[str, int], plan: BatchPlan, info: DistInfo,
                pin_memory: bool, augmenter: Optional[Augmenter] = None):
    crop = int(round(cfg.data.crop_seconds * cfg.data.sample_rate))
    dataset = CropDataset([data.wav[u] for u in data.utts], [spk2idx[data.utt2spk[u]] for u in data.utts],
                          [data.num_samples[u] for u in data.utts], crop, cfg.data.sample_rate, augmenter)
    sampler = GlobalBatchSampler(len(dataset), plan.global_batch, plan.per_device, plan.accumulation,
                                 info.rank, info.world_size, cfg.train.seed)
    hw = cfg.hardware
    extra = {"prefetch_factor": hw.prefetch_factor, "persistent_workers": False} if hw.num_workers > 0 else {}
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, num_workers=hw.num_workers,
                                         pin_memory=pin_memory, **extra)
    return loader, sampler


def choose_plan(cfg: Config, info: DistInfo, device: torch.device, probe: Optional[Callable[[int], bool]],
                log: Callable[[str], None]) -> BatchPlan:
    """The batch plan: per-device batch from the config, or `auto`: the largest of 16..128 for which
    `probe(batch)` says it fits (CUDA passes `cuda_probe`); without a probe (CPU) auto means 64."""
    pdb = cfg.hardware.per_device_batch
    share = cfg.train.global_batch_size // max(1, info.world_size)
    if pdb == "auto":
        if probe is not None:
            found = find_max_batch(probe)
            if found is None:
                raise RuntimeError(f"per_device_batch auto: even a batch of 16 does not fit on {device}; "
                                   "lower data.crop_seconds or use a smaller model")
            pdb = found
            if info.enabled:  # every rank must use the same micro batch: take the smallest card's
                t = torch.tensor([pdb], device=device)
                torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN)
                pdb = int(t.item())
            log(f"per_device_batch auto: {pdb} fits with margin {cfg.hardware.memory_margin}")
        else:
            pdb = min(64, share)
    return plan_batches(cfg.train.global_batch_size, info.world_size, int(pdb))


def cuda_probe(net: nn.Module, fbank_frames: int, feat_dim: int, num_speakers: int, device: torch.device,
               margin: float) -> Callable[[int], bool]:
    """`fits(batch)`: a real forward+backward at the crop length; False on OOM or peak > margin x memory."""
    total = torch.cuda.get_device_properties(device).total_memory

    def fits(batch: int) -> bool:
        net.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        try:
            feats = torch.randn(batch, fbank_frames, feat_dim, device=device)
            labels = torch.randint(0, num_speakers, (batch,), device=device)
            loss, _ = net(feats, labels)
            loss.backward()
            peak = torch.cuda.max_memory_allocated(device)
        except torch.OutOfMemoryError:
            peak = float("inf")
        net.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
        return peak <= margin * total

    return fits
