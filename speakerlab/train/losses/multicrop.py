"""Multi-crop self-distillation as the training step sees it: the loader batch's waves in, (loss, agreement) out.

    inputs = WaveInputs(pipeline)          # loader batch -> (waves (B, N) augmented, dataset index (B,))
    net = DinoNet(model, objective, features, settings, sample_rate, seed, autocast)
    loss, top1 = net(waves, index)         # in place of SpeakerNet(feats, labels)

Each utterance's loaded training crop (data.crop_seconds) is cut into dino.global_crops crops of global_seconds
and dino.local_crops of local_seconds, at offsets drawn from (train.seed, optimizer step, dataset index, crop
number) alone: the same crops on any device count and after a resume; with dino.disjoint_globals the global
crops come from separate parts of it and share no audio. The crops go through the front end (fp32),
the student sees all of them, the teacher the global ones (speakerlab.train.losses.dino).

`top1` is not a speaker: it is the row's index where the student's prototype on the first global crop is the
teacher's on the second (without distillation: where the first global crop's nearest other crop is one of its
own), else -1, so the step's `accuracy` (top1 == label, the label being the index) is the share of utterances on
which student and teacher agree (the crops find each other).
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn as nn
from torch import Tensor

from speakerlab.objectives import DinoSettings
from speakerlab.train.inputs.pipeline import InputPipeline
from speakerlab.train.losses.dino import DinoObjective, nearest_is_own

PRIME = 2**31 - 1  # Park-Miller generator: x -> 48271 x mod PRIME stays within int64 on every device


def crop_offsets(index: Tensor, step: int, seed: int, crop: int, room: int) -> Tensor:
    """Start of crop number `crop` in each row `(B,) -> (B,)`, uniform in [0, room], a function of (seed, step,
    dataset index, crop) only."""
    x = (index.long() * 1_000_003 + step * 7_919 + crop * 104_729 + seed) % PRIME + 1
    for _ in range(3):
        x = (x * 48_271) % PRIME
    return x % (room + 1)


def cut_crops(
    waves: Tensor, index: Tensor, step: int, seed: int, first: int, count: int, length: int, disjoint: bool = False
) -> Tensor:
    """`count` crops of `length` samples of each row of `waves`, crop numbers first.. first+count-1:
    `(count x B, length)`, crop-major (all rows' first crop, then their second, ...). `waves` is `(B, N)`, shared
    by the crops, or `(count, B, N)`: crop c is cut from `waves[c]` (its own augmented copy). `disjoint`: crop c
    lies within the c-th of `count` equal parts of the N samples, so no two crops share a sample."""
    span = waves.shape[-1] // count if disjoint else waves.shape[-1]
    room = span - length
    if room < 0:
        raise ValueError(f"a crop of {length} samples does not fit the loaded {waves.shape[-1]} ({count} parts)")
    starts = torch.stack(
        [crop_offsets(index, step, seed, first + c, room) + (c * span if disjoint else 0) for c in range(count)]
    )  # (count, B)
    at = starts.unsqueeze(-1) + torch.arange(length, device=waves.device)  # (count, B, length)
    source = waves.unsqueeze(0).expand(count, -1, -1) if waves.dim() == 2 else waves
    return torch.gather(source, 2, at).reshape(-1, length)


class WaveInputs(nn.Module):
    """`forward(batch) -> (waves (C x B, N) float32, index (B,) int64)`: the input pipeline's augmented crops
    (speakerlab.train.inputs.pipeline) without the front end, which runs per crop in DinoNet; C = 1 without
    augmentation, else one augmented copy per DINO crop."""

    def __init__(self, pipeline: InputPipeline):
        super().__init__()
        self.pipeline = pipeline

    @property
    def features(self) -> nn.Module:
        return self.pipeline.features

    def forward(self, batch: Dict[str, object]) -> Tuple[Tensor, Tensor]:
        if "feats" in batch:
            raise ValueError("loss.name dino cuts its crops from the audio, not from stored features")
        return self.pipeline.waves(batch), batch["index"].to(self.pipeline.device, non_blocking=True)


class DinoNet(nn.Module):
    """Student (embedding model + head), teacher and centre of a DINO run, one module so DDP sees every trained
    parameter; `forward(waves (B, N), index (B,)) -> (loss, (B,) agreement as in the module doc)`. Autocast
    applies to the embedding models only; the front end and the heads compute in fp32."""

    def __init__(
        self,
        model: nn.Module,
        objective: DinoObjective,
        features: nn.Module,
        s: DinoSettings,
        sample_rate: int,
        seed: int,
        autocast: Callable,
    ):
        super().__init__()
        self.model, self.classifier, self.features = model, objective, features
        self.global_len = int(round(s.global_seconds * sample_rate))
        self.local_len = int(round(s.local_seconds * sample_rate))
        self.s, self.seed, self._autocast = s, seed, autocast
        self.compiled: Optional[Callable] = None  # hardware.compile: the compiled student model

    def embed(self, feats: Tensor) -> Tensor:
        """Student embeddings of the crops' features `(C, T, F) -> (C, D)`."""
        with self._autocast():
            return self.model(feats) if self.compiled is None else self.compiled(feats)

    def forward(self, waves: Tensor, index: Tensor):
        """`waves (B, N)`, or `(crops x B, N)`: one augmented copy per crop, copy-major; `index (B,)`."""
        s, step, obj = self.s, self.classifier.step, self.classifier
        obj.start(self.model)
        glob, local = waves, waves
        if len(waves) != len(index):  # each crop from its own augmented copy
            copies = waves.view(-1, len(index), waves.shape[-1])
            glob, local = copies[: s.global_crops], copies[s.global_crops :]
        # The global crops' features once for student and teacher (one dither draw)
        feats = self.features(
            cut_crops(glob, index, step, self.seed, 0, s.global_crops, self.global_len, s.disjoint_globals)
        )
        emb = self.embed(feats).float()  # (global_crops x B, D)
        b = len(index)
        projected = obj.head.project(emb)  # (global_crops x B, bottleneck), unit rows
        student: List[Tensor] = []
        teacher: List[Tensor] = []
        if obj.distill:
            student = list(obj.head.prototypes(projected).chunk(s.global_crops))
            if s.local_crops:
                local = cut_crops(local, index, step, self.seed, s.global_crops, s.local_crops, self.local_len)
                student += list(obj.head(self.embed(self.features(local)).float()).chunk(s.local_crops))
            with torch.no_grad():
                with self._autocast():
                    t_emb = obj.teacher["model"](feats)
                teacher = list(obj.teacher["head"](t_emb.float()).chunk(s.global_crops))
            agree = student[0].argmax(-1) == teacher[1].argmax(-1)
        views = projected.view(s.global_crops, b, -1)
        if not obj.distill:
            agree = nearest_is_own(views)
        unit = nn.functional.normalize(emb[:b], dim=-1)
        mean_emb = emb.reshape(s.global_crops, b, -1).mean(dim=0)
        loss = obj.loss(student, teacher, unit, mean_emb, views)
        return loss, torch.where(agree, index, torch.full_like(index, -1))

    def clip_grad_norm(self, params: List[Tensor], max_norm: float, agree: Callable) -> Tensor:
        """As the classifier's (speakerlab.train.build): the step's one all-reduce through `agree`, here with zero
        (no sharded rows: the student's gradients are already averaged by DDP)."""
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        agree(torch.zeros((), dtype=torch.float64, device=norm.device))
        return norm

    def end_step(self, updated: torch.Tensor) -> None:
        """Centre and teacher after the optimizer step (speakerlab.train.losses.dino). `updated` (0-dim bool on the
        device) is read on the host here: DINO's step waits for its own all-reduce of the teacher's sums anyway."""
        self.classifier.end_step(bool(updated), self.model)

    def scalars(self) -> Dict[str, float]:
        return self.classifier.scalars()

    def end_of_run_problem(self) -> Optional[str]:
        return self.classifier.collapse_problem()
