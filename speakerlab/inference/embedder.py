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
from typing import Optional, Sequence, Union

import numpy as np
import torch
import torch.nn as nn

from speakerlab.dataio.waveform.resample import read_for_model
from speakerlab.devices import resolve_device, use_threads
from speakerlab.features.spec import build_features
from speakerlab.frontends import FRONT_ENDS, FeatureSpec
from speakerlab.inference.common import (  # noqa: F401 (the torch-free parts, imported from here too)
    NonFiniteEmbedding,
    add_source_args,
    check_finite,
    embed_in_batches,
    length_batches,
    shortest_input,
)
from speakerlab.sources import Source, read_source


class Embedder:
    """`(B, samples)` waves at `sample_rate` -> `(B, D)` embeddings: the front-end of `spec`
    (speakerlab.features.spec), then the model.

    The model is used as given (callers decide train/eval mode: `load_embedder` returns eval mode);
    `name` says where it came from, for logs; `model_id`, for a speakerlab checkpoint its content digest,
    which embeddings files record (the model that made them) and `speakerlab-verify` matches. `workers`: threads
    that embed batches at once in `embed_waves` (speakerlab.inference.common.embed_in_batches; 1 by default).
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
        self.workers = 1
        self._min_samples: Optional[int] = None

    @property
    def sample_rate(self) -> int:
        return self.spec.sample_rate

    def num_frames(self, num_samples: int) -> int:
        """Frames of model input for `num_samples` samples."""
        return self.features.num_frames(num_samples)

    @property
    def min_samples(self) -> int:
        """The shortest input this model embeds, in samples at `sample_rate` (MIN_FRAMES feature frames): what
        a waveform ONNX export states as `min_samples`, and what every command refuses below."""
        if self._min_samples is None:
            self._min_samples = shortest_input(self.num_frames, 60 * self.sample_rate)
        return self._min_samples

    def read(self, path: str, warn=None) -> np.ndarray:
        """A whole file at this embedder's sample rate: `(samples,)` float32. Other rates are resampled
        in torch; a multi-channel file gives its first channel, with a warning naming it (to `warn`)."""
        return read_for_model(path, self.sample_rate, warn)

    @torch.no_grad()
    def __call__(self, waves: torch.Tensor) -> torch.Tensor:
        """`(B, samples)` float waves -> `(B, D)` float32 embeddings, on this embedder's device."""
        return self.model(self.features(waves.to(self.device, torch.float32))).float()

    def embed_waves(self, waves: Sequence[np.ndarray], max_batch: int = 32, pad_ratio: float = 0.0) -> np.ndarray:
        """Whole waves of any lengths -> `(N, D)` float32, in input order, batched by the front-end's batch
        length (`speakerlab.inference.common.embed_in_batches`; `pad_ratio` > 0: faster, slightly different
        from exact whole-utterance embeddings)."""

        def embed(rows: np.ndarray) -> np.ndarray:
            return self(torch.from_numpy(rows)).cpu().numpy()

        return embed_in_batches(waves, self.features.batch_length, embed, max_batch, pad_ratio, self.workers)

    @torch.no_grad()
    def embed_fbank(self, feats: torch.Tensor) -> torch.Tensor:
        """`(B, frames, F)` stored fbank (the offline feature store: no mean normalisation; kaldi_fbank
        front-ends only) -> `(B, D)` float32 embeddings: normalisation per this embedder's spec, then the model."""
        if not FRONT_ENDS[self.spec.kind].storable:
            raise ValueError(f"stored Kaldi fbank cannot feed a model of front-end {self.spec.kind}")
        return self.model(self.features.normalize(feats.to(self.device, torch.float32))).float()


def load_embedder(
    checkpoint: Optional[Union[str, Path, Source]] = None,
    *,
    threedspeaker: Optional[str] = None,
    weights: Optional[Union[str, Path]] = None,
    redimnet2: Optional[Union[str, Path]] = None,
    onnx: Optional[Union[str, Path]] = None,
    device: Union[str, torch.device] = "auto",
) -> Embedder:
    """An eval-mode `Embedder` of one pretrained source (speakerlab.sources; a SourceError names the file):

    - `checkpoint`: a speakerlab checkpoint file, or an exp dir (its newest intact checkpoint, a corrupt
      newer one reported on stderr); or a `Source` already read.
    - `threedspeaker=NAME, weights=FILE`: a 3D-Speaker state dict for the registered model NAME.
    - `redimnet2=FILE`: a released ReDimNet2 file, with its own front-end.
    - `onnx=FILE`: a waveform ONNX file of speakerlab-export, run on the CPU by onnxruntime: an `OnnxEmbedder`
      (speakerlab.inference.deploy.runtime) with the same `read` and `embed_waves`. Without torch installed, import
      this function from `speakerlab.inference` instead.
    """
    if sum(x is not None for x in (checkpoint, threedspeaker, redimnet2, onnx)) != 1:
        raise ValueError(
            "give exactly one of a checkpoint, a 3D-Speaker model name (with weights), a ReDimNet2 file or an ONNX file"
        )
    if onnx is not None:
        from speakerlab.inference.deploy.runtime import load_onnx

        return load_onnx(onnx)
    dev = resolve_device(device) if isinstance(device, str) else device
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


def source_from_args(ap: argparse.ArgumentParser, args) -> Source:
    """The pretrained source of the options of `add_source_args` (speakerlab.sources.read_source); one that cannot
    be read is a SourceError (a ValueError) naming its file."""
    if args.threedspeaker and not args.weights:
        ap.error("--3dspeaker needs --weights")
    if args.weights and not args.threedspeaker:
        ap.error("--weights goes with --3dspeaker NAME")
    if args.threedspeaker:
        return read_source(args.weights, threedspeaker=args.threedspeaker)
    kind = "speakerlab" if args.checkpoint is not None else "redimnet2"
    return read_source(args.checkpoint or args.redimnet2, kind=kind, warn=lambda m: print(m, file=sys.stderr))


def embedder_from_args(ap: argparse.ArgumentParser, args) -> Embedder:
    """`load_embedder` of the source of the options of `add_source_args` (`source_from_args`) on `--device`, with
    `--threads` (its log line kept as `args.threads_line` for the command's summary)."""
    args.threads_line = use_threads(args.threads)[1]
    return load_embedder(source_from_args(ap, args), device=args.device)
