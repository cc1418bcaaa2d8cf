"""The one inference path: a pretrained source (ours, a 3D-Speaker state dict or a ReDimNet2 release, read by
speakerlab.sources) -> an `Embedder`, the model in eval mode together with the front-end it was trained with.

    embedder = load_embedder("exp/campplus")                      # an exp dir: its latest checkpoint
    embedder = load_embedder(threedspeaker="campplus", weights="campplus_cn_en_common.pt")
    embedder = load_embedder(redimnet2="b6-vox2-lm.pt")           # a ReDimNet2 release, its own log-mel
    emb = embedder.embed_waves([embedder.read("a.wav"), embedder.read("b.wav")])   # (2, D)

Extraction, inference, export, the no-training baseline and training-time validation all embed
through this module; none of it imports the training engine.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional, Sequence, Union

import numpy as np
import torch
import torch.nn as nn

from speakerlab.dataio.resample import read_for_model
from speakerlab.devices import resolve_device
from speakerlab.features.spec import FeatureSpec, build_features
from speakerlab.sources import Source, read_source


class NonFiniteEmbedding(ValueError):
    """Some inputs gave NaN/inf embeddings (usually NaN or inf samples in the audio); the message names them."""


def check_finite(names: Sequence[str], emb: np.ndarray) -> None:
    """Raise NonFiniteEmbedding naming every row of `emb` (N, D) that is not finite; `names` (N,) say
    where each row came from (file, or list:line and utterance)."""
    bad = [names[i] for i in np.flatnonzero(~np.isfinite(emb).all(axis=1))]
    if bad:
        shown = "\n  ".join(bad[:50]) + (f"\n  ... and {len(bad) - 50} more" if len(bad) > 50 else "")
        raise NonFiniteEmbedding(
            f"{len(bad)} input(s) gave a non-finite embedding (NaN or inf in the audio?); "
            f"nothing was written:\n  {shown}"
        )


class Embedder:
    """`(B, samples)` waves at `sample_rate` -> `(B, D)` embeddings: the front-end of `spec`
    (speakerlab.features.spec), then the model.

    The model is used as given (callers decide train/eval mode: `load_embedder` returns eval mode);
    `name` says where it came from, for logs; `model_id`, for a speakerlab checkpoint its content digest,
    which embeddings files record (the model that made them) and `speakerlab-verify` matches.
    """

    def __init__(
        self,
        model: nn.Module,
        spec: FeatureSpec,
        device: Union[str, torch.device] = "cpu",
        name: str = "",
        model_id: str = "",
    ):
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.spec = spec
        self.features = build_features(spec).to(self.device)
        self.name, self.model_id = name, model_id

    @property
    def sample_rate(self) -> int:
        return self.spec.sample_rate

    def num_frames(self, num_samples: int) -> int:
        """Frames of model input for `num_samples` samples."""
        return self.features.num_frames(num_samples)

    def read(self, path: str) -> np.ndarray:
        """A whole file at this embedder's sample rate: `(samples,)` float32. Other rates are resampled
        in torch; a multi-channel file gives its first channel, with a warning naming it."""
        return read_for_model(path, self.sample_rate)

    @torch.no_grad()
    def __call__(self, waves: torch.Tensor) -> torch.Tensor:
        """`(B, samples)` float waves -> `(B, D)` float32 embeddings, on this embedder's device."""
        return self.model(self.features(waves.to(self.device, torch.float32))).float()

    def embed_waves(self, waves: Sequence[np.ndarray], max_batch: int = 32, pad_ratio: float = 0.0) -> np.ndarray:
        """Whole waves of any lengths -> `(N, D)` float32, in input order.

        Waves of equal batch length (the front-end's: fbank frames, or samples) share a batch; with
        `pad_ratio` r > 0 waves up to r x longer than the shortest do too, the shorter ones repeated to
        the batch length (faster, slightly different from exact whole-utterance embeddings)."""
        lengths = [self.features.batch_length(len(w)) for w in waves]
        out: List[Optional[np.ndarray]] = [None] * len(waves)
        for batch in length_batches(lengths, max_batch, pad_ratio):
            n = max(len(waves[i]) for i in batch)
            # Repeat (not zero-pad) shorter members: padding with silence would shift the statistics.
            rows = np.stack([np.resize(np.asarray(waves[i], dtype=np.float32), n) for i in batch])
            emb = self(torch.from_numpy(rows)).cpu().numpy()
            for j, i in enumerate(batch):
                out[i] = emb[j]
        return np.stack(out).astype(np.float32) if out else np.zeros((0, 0), np.float32)

    @torch.no_grad()
    def embed_fbank(self, feats: torch.Tensor) -> torch.Tensor:
        """`(B, frames, F)` stored fbank (the offline feature store: no mean normalisation; kaldi_fbank
        front-ends only) -> `(B, D)` float32 embeddings: normalisation per this embedder's spec, then the model."""
        if self.spec.kind != "kaldi_fbank":
            raise ValueError(f"stored Kaldi fbank cannot feed a model of front-end {self.spec.kind}")
        return self.model(self.features.normalize(feats.to(self.device, torch.float32))).float()


def length_batches(
    frames: Sequence[int], max_batch: int, pad_ratio: float, max_total: Optional[int] = None
) -> List[List[int]]:
    """Indices of `frames`, sorted by length, in batches of <= max_batch whose longest is at most
    (1 + pad_ratio) x their shortest and, with `max_total`, whose longest x size is at most that (a
    bound on the padded batch, so long utterances come in small batches)."""
    order = sorted(range(len(frames)), key=lambda i: (frames[i], i))
    batches: List[List[int]] = []
    for i in order:
        if (
            batches
            and len(batches[-1]) < max_batch
            and frames[i] <= frames[batches[-1][0]] * (1 + pad_ratio)
            and (max_total is None or frames[i] * (len(batches[-1]) + 1) <= max_total)
        ):
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def load_embedder(
    checkpoint: Optional[Union[str, Path, Source]] = None,
    *,
    threedspeaker: Optional[str] = None,
    weights: Optional[Union[str, Path]] = None,
    redimnet2: Optional[Union[str, Path]] = None,
    device: Union[str, torch.device] = "auto",
) -> Embedder:
    """An eval-mode `Embedder` of one pretrained source (speakerlab.sources; a SourceError names the file):

    - `checkpoint`: a speakerlab checkpoint file, or an exp dir (its newest intact checkpoint, a corrupt
      newer one reported on stderr); or a `Source` already read.
    - `threedspeaker=NAME, weights=FILE`: a 3D-Speaker state dict for the registered model NAME.
    - `redimnet2=FILE`: a released ReDimNet2 file, with its own front-end.
    """
    dev = resolve_device(device) if isinstance(device, str) else device
    if sum(x is not None for x in (checkpoint, threedspeaker, redimnet2)) != 1:
        raise ValueError("give exactly one of a checkpoint, a 3D-Speaker model name (with weights) or a ReDimNet2 file")
    if isinstance(checkpoint, Source):
        src = checkpoint
    elif threedspeaker is not None:
        if weights is None:
            raise ValueError(f"3D-Speaker model {threedspeaker!r} needs its weights file")
        src = read_source(weights, threedspeaker=threedspeaker)
    else:
        kind = "speakerlab" if checkpoint is not None else "redimnet2"
        src = read_source(checkpoint or redimnet2, kind=kind, warn=lambda m: print(m, file=sys.stderr))
    return Embedder(src.build(), src.features, dev, src.describe(), src.digest)


def add_source_args(ap: argparse.ArgumentParser) -> None:
    """The options every inference command takes to name its model: `--checkpoint`, `--3dspeaker NAME
    --weights FILE` or `--redimnet2 FILE`, and `--device`."""
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="a speakerlab checkpoint file, or an exp dir (its latest checkpoint)")
    src.add_argument(
        "--3dspeaker",
        dest="threedspeaker",
        metavar="NAME",
        help="registered model name of a 3D-Speaker state dict given by --weights (e.g. campplus)",
    )
    src.add_argument(
        "--redimnet2",
        metavar="FILE",
        help="a released ReDimNet2 file ({model_config, state_dict}, e.g. b6-vox2-lm.pt), with its own front-end",
    )
    ap.add_argument("--weights", help="3D-Speaker weights file (.pt/.bin/.ckpt state dict), with --3dspeaker")
    ap.add_argument("--device", default="auto", help="auto (default), cpu, cuda, cuda:N, mps")


def embedder_from_args(ap: argparse.ArgumentParser, args) -> Embedder:
    """`load_embedder` from the options of `add_source_args`; a source that does not load is a SourceError (a
    ValueError) naming its file."""
    if args.threedspeaker and not args.weights:
        ap.error("--3dspeaker needs --weights")
    if args.weights and not args.threedspeaker:
        ap.error("--weights goes with --3dspeaker NAME")
    return load_embedder(
        args.checkpoint,
        threedspeaker=args.threedspeaker,
        weights=args.weights,
        redimnet2=args.redimnet2,
        device=args.device,
    )
