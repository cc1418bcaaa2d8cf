"""The torch-free runtime of waveform ONNX files: numpy, soundfile, scipy and onnxruntime only.

    embedder = load_onnx("campplus.onnx")            # or speakerlab.inference.load_embedder(onnx=...)
    emb = embedder.embed_waves([embedder.read("a.wav"), embedder.read("b.wav")])   # (2, D) float32
    speakerlab-embed data/test/wav.scp test.npz --onnx campplus.onnx

A file of `speakerlab-export --waveform` holds the model's own front end and the model: `wave (B, N)` float
samples at its input rate and `lengths (B,)` int64 -> `embedding (B, D)` (speakerlab.inference.deploy.graph), and
its metadata (`META`): format, model, input rate, feature spec, embedding size, project version, how to batch,
the shortest input, a calibrated threshold where the exp dir had one, the int8 check where quantised; for fp32 files
the checkpoint's digest and, where the exp dir had one of that checkpoint, its calibration (`OnnxEmbedder.calibration`:
LLRs and operating points, speakerlab.scoring.calibration_file).

`OnnxEmbedder` answers what `speakerlab.inference.embedder.Embedder` does for files: `read` (any rate, resampled
with `scipy.signal.resample_poly`, the same polyphase filter as the torch path's Resampler, so both give the
same samples to ~1e-5; multi-channel: the first channel, with a warning), `num_frames` and `embed_waves`
(batched by length exactly as the torch path: speakerlab.inference.common.embed_in_batches).

Why scipy for resampling: it is what the torch path reproduces (speakerlab.dataio.waveform.speed),
so an 8 kHz or 44.1 kHz
file embeds the same in both runtimes; it is maintained with numpy, has wheels everywhere, and needs no system
library. (soxr is faster and of higher quality, but would give other samples than the torch path.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence, Union

import numpy as np

from speakerlab.dataio.audio import AudioError, read_first_channel
from speakerlab.dataio.waveform.resample import resample
from speakerlab.inference.common import MIN_FRAMES, embed_in_batches

FORMAT = "speakerlab.waveform/1"  # a waveform-in file; "speakerlab.features/1": the model over (B, T, F)
FEATURES_FORMAT = "speakerlab.features/1"
# The metadata_props keys of an exported file; values are strings (JSON where structured).
META = {
    "format": "speakerlab.format",
    "model": "speakerlab.model",  # the registered model name
    "source": "speakerlab.source",  # where it came from (checkpoint path, 3D-Speaker file, release)
    "version": "speakerlab.version",  # the speakerlab that exported it
    "sample_rate": "speakerlab.sample_rate",  # Hz of the wave input (the model's, or the declared input rate)
    "features": "speakerlab.features",  # JSON FeatureSpec.to_dict() of the front end in the graph
    "embedding_size": "speakerlab.embedding_size",
    "batching": "speakerlab.batching",  # JSON {"by": "frames", "window", "shift"} or {"by": "samples"}
    "min_samples": "speakerlab.min_samples",  # the shortest input that gives MIN_FRAMES feature frames
    "threshold": "speakerlab.threshold",  # cosine EER threshold of the exp dir's scoring, when there was one
    "threshold_source": "speakerlab.threshold_source",
    "int8": "speakerlab.int8",  # JSON: mode, cosine to fp32, EERs, when quantised
    "model_id": "speakerlab.model_id",  # the checkpoint's content digest (fp32 files: the same embeddings to 1e-4)
    "calibration": "speakerlab.calibration",  # JSON calibration file of that checkpoint (scoring.calibration_file)
}


class OnnxModelError(ValueError):
    """A file that is not a waveform ONNX file of speakerlab; the message names it."""


class OnnxEmbedder:
    """A waveform ONNX file on onnxruntime: `(B, samples)` float32 at `sample_rate` -> `(B, D)` float32.

    `resample=False` makes a file at another rate an error instead of resampling it. `threads` sets
    onnxruntime's intra-op threads (default: its own, the physical cores); `workers`, the threads that run batches
    at once in `embed_waves` (1 by default; speakerlab.inference.common.embed_in_batches)."""

    def __init__(self, path: Union[str, Path], resample: bool = True, threads: Optional[int] = None):
        import onnxruntime as ort

        self.path = str(path)
        self.workers = 1
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        try:
            self.session = ort.InferenceSession(self.path, options, providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime raises its own Fail / InvalidProtobuf / NoSuchFile
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise OnnxModelError(f"{path}: not a readable ONNX file ({first})") from None
        self.meta = read_metadata(self.session.get_modelmeta().custom_metadata_map, self.path)
        self.resample = resample
        self.name = f"{self.meta['model']} ({self.path}{', int8 ' + self.int8['mode'] if self.int8 else ''})"
        # Embeddings files record a checkpoint's digest (Embedder.model_id) for speakerlab-verify and calibrations to
        # match. An fp32 file carries its checkpoint's (checked against PyTorch to 1e-4 when exported); an int8 file
        # gives other embeddings, so it names no model and no calibration of fp32 scores applies to it.
        self.model_id = "" if self.int8 else self.meta.get("model_id", "")

    @property
    def sample_rate(self) -> int:
        return int(self.meta["sample_rate"])

    @property
    def embedding_size(self) -> int:
        return int(self.meta["embedding_size"])

    @property
    def threshold(self) -> Optional[float]:
        """The cosine EER threshold of the exp dir's scoring (`threshold_source` says which list), else None."""
        return float(self.meta["threshold"]) if "threshold" in self.meta else None

    @property
    def calibration(self):
        """The calibration the file carries (a speakerlab.scoring.calibration_file.Calibration), else None."""
        if "calibration" not in self.meta or self.int8:
            return None
        from speakerlab.scoring.calibration_file import Calibration

        return Calibration.from_json(self.meta["calibration"], f"{self.path} (metadata {META['calibration']})")

    @property
    def int8(self) -> Optional[Dict]:
        return json.loads(self.meta["int8"]) if "int8" in self.meta else None

    @property
    def min_samples(self) -> int:
        """The shortest input the file embeds, in samples at `sample_rate` (its `min_samples` metadata)."""
        return int(self.meta["min_samples"])

    def num_frames(self, num_samples: int) -> int:
        """Feature frames for `num_samples` samples (or, for files batched by samples, whether there are
        enough: MIN_FRAMES when `num_samples` >= the file's shortest input, else 0)."""
        b = json.loads(self.meta["batching"])
        if b["by"] == "frames":
            return 0 if num_samples < b["window"] else 1 + (num_samples - b["window"]) // b["shift"]
        return MIN_FRAMES if num_samples >= int(self.meta["min_samples"]) else 0

    def batch_length(self, num_samples: int) -> int:
        """Waves of equal batch length share a batch and still get exactly their own embeddings."""
        by_frames = json.loads(self.meta["batching"])["by"] == "frames"
        return self.num_frames(num_samples) if by_frames else num_samples

    def read(self, path: str, warn: Optional[Callable[[str], None]] = None) -> np.ndarray:
        """A whole file at this model's input rate, `(samples,)` float32: another rate resampled (or, with
        `resample=False`, an AudioError), a multi-channel file's first channel with a warning to `warn`."""
        wave, sr = read_first_channel(path, warn)
        if sr != self.sample_rate and not self.resample:
            raise AudioError(f"{path}: {sr} Hz, the model takes {self.sample_rate} Hz (resampling is off)")
        return resample(wave, sr, self.sample_rate)

    def __call__(self, waves: np.ndarray, lengths: Optional[np.ndarray] = None) -> np.ndarray:
        """`(B, N)` samples (+ `(B,)` lengths of a right-padded batch; default all N) -> `(B, D)` float32."""
        waves = np.ascontiguousarray(waves, dtype=np.float32)
        if lengths is None:
            lengths = np.full(waves.shape[0], waves.shape[1], np.int64)
        b = json.loads(self.meta["batching"])
        if b["by"] == "frames" and len(lengths) and int(np.min(lengths)) < b["window"]:
            # The graph would fail inside onnxruntime (INVALID_ARGUMENT of a Conv); the torch path's fbank says this.
            raise ValueError(
                f"wave of {int(np.min(lengths))} samples is too short for one frame of {b['window']} samples "
                "(snip_edges=True)"
            )
        return self.session.run(None, {"wave": waves, "lengths": np.asarray(lengths, np.int64)})[0]

    def embed_waves(self, waves: Sequence[np.ndarray], max_batch: int = 32, pad_ratio: float = 0.0) -> np.ndarray:
        """Whole waves of any lengths -> `(N, D)` float32 in input order, batched as the torch path
        (speakerlab.inference.common.embed_in_batches)."""
        return embed_in_batches(waves, self.batch_length, self, max_batch, pad_ratio, self.workers)


def read_metadata(props: Dict[str, str], path: str) -> Dict[str, str]:
    """The speakerlab metadata of a file (`META` names -> values); an OnnxModelError says why it is not a
    waveform file of ours."""
    fmt = props.get(META["format"])
    if fmt is None:
        raise OnnxModelError(
            f"{path}: an ONNX file without speakerlab metadata (another project's?); "
            "make one with speakerlab-export --waveform"
        )
    if fmt == FEATURES_FORMAT:
        raise OnnxModelError(
            f"{path}: this ONNX file takes features (B, T, F), not audio; export with speakerlab-export --waveform"
        )
    if fmt != FORMAT:
        raise OnnxModelError(f"{path}: ONNX format {fmt!r} is not {FORMAT!r} (a newer speakerlab wrote it?)")
    meta = {name: props[key] for name, key in META.items() if key in props}
    missing = [META[k] for k in ("model", "sample_rate", "embedding_size", "batching", "min_samples") if k not in meta]
    if missing:
        raise OnnxModelError(f"{path}: speakerlab metadata lacks {', '.join(missing)}")
    return meta


def load_onnx(path: Union[str, Path], resample: bool = True, threads: Optional[int] = None) -> OnnxEmbedder:
    """An `OnnxEmbedder` of a waveform ONNX file (OnnxModelError, a ValueError naming the file, when it is not
    one); `speakerlab.inference.load_embedder(onnx=path)` is the same."""
    return OnnxEmbedder(path, resample=resample, threads=threads)
