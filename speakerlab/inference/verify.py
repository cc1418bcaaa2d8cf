"""Verification decisions with a model's calibration: the Python API of `speakerlab-verify`, the same on the torch
path and on a waveform ONNX file (no torch imported here).

    embedder = speakerlab.inference.load_embedder(onnx="campplus.onnx")     # or load_embedder("exp/campplus")
    d = verify_files(embedder, "a.wav", "b.wav", far=0.01)
    d.llr, d.probability, d.same, d.source    # calibrated LLR, P(same) at `prior`, the decision, which calibration

Which calibration (`find_calibration`): the file given (`calibration=`), else the one in the ONNX file's metadata
(speakerlab-export --waveform copies `<exp>/calibration.json` into it), else `<exp>/calibration.json` of a
checkpoint's exp dir (speakerlab-calibrate, recipe stage 8). Every one must name this model's digest: a calibration
fitted on another model's scores is refused (CalibrationError, one line) when it was asked for by name or carried in
the file, and passed over with a warning when it merely lies in the exp dir (an earlier checkpoint's). Without one,
`Decision.llr` is None and the decision is the cosine threshold's (speakerlab.inference.cli).

The decision at `far`: accept iff llr >= the LLR threshold whose false-alarm rate on the calibration lists was `far`
(Calibration.threshold). The probability is the posterior of "same speaker" at `prior`: sigmoid(llr + logit(prior)).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Tuple

import numpy as np

from speakerlab.inference.common import read_wave
from speakerlab.scoring.calibration_file import Calibration, CalibrationError, read_calibration

CALIBRATION_FILE = "calibration.json"  # in the exp dir, beside checkpoints/


@dataclass
class Decision:
    """One trial's outcome: the cosine `score`; with a calibration the `llr`, `probability` (of the same speaker at
    `prior`) and the LLR `threshold` at `far`, else `threshold` on the cosine; `same`; `source`: where the
    calibration or threshold came from."""

    score: float
    threshold: float
    same: bool
    source: str
    llr: Optional[float] = None
    probability: Optional[float] = None
    far: Optional[float] = None
    prior: float = 0.5

    def lines(self) -> list:
        """What speakerlab-verify prints."""
        out = [f"score {self.score:.6f}"]
        if self.llr is None:
            out.append(f"threshold {self.threshold:.6f} ({self.source})")
        else:
            out += [
                f"llr {self.llr:.4f} (calibration {self.source})",
                f"probability {self.probability:.4f} (same speaker, at prior {self.prior:g})",
                f"threshold llr {self.threshold:.4f} at FAR {100 * self.far:g} % (measured on the calibration lists)",
            ]
        out.append("same speaker" if self.same else "different speakers")
        return out


def exp_dir_of(checkpoint) -> Path:
    """The exp dir of a checkpoint path: the folder itself, or the run a checkpoint file belongs to."""
    p = Path(checkpoint)
    if p.is_dir():
        return p.parent if p.name == "checkpoints" else p
    return p.parent.parent if p.parent.name == "checkpoints" else p.parent


def scored_threshold(checkpoint, model_id: str) -> Optional[Tuple[float, Path, dict]]:
    """The cosine EER threshold the scoring stage found for the model `model_id` under the exp dir of `checkpoint`:
    the first `<exp>/scores/**/*.json` (by name) of speakerlab-score with plain cosine scoring of its embeddings ->
    (threshold, that file, its summary), or None (no such scoring, or no model id). A summary of another checkpoint
    of the run (a fine-tuning run's pretrained.pt, an earlier epoch) is not this model's threshold."""
    if not model_id:
        return None
    for path in sorted((exp_dir_of(checkpoint) / "scores").rglob("*.json")):
        try:
            s = json.loads(path.read_text())
            scoring = s["scoring"]
            if scoring.get("model_id") == model_id and scoring.get("method") == "cosine":
                return float(s["operating_points"]["eer"]["threshold"]), path, s
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # not a scoring summary
    return None


def exp_calibration(checkpoint, model_id: str, warn: Callable[[str], None]) -> Optional[Tuple[Calibration, str]]:
    """`<exp>/calibration.json` of a checkpoint's exp dir when it is this model's (`model_id`) -> (it, its path);
    None when there is none, or (with a warning) when it is another checkpoint's."""
    path = exp_dir_of(checkpoint) / CALIBRATION_FILE
    if not path.is_file():
        return None
    cal = read_calibration(path)
    try:
        cal.check_model(model_id, str(path))
    except CalibrationError as e:
        warn(f"not used: {e}")
        return None
    return cal, str(path)


def find_calibration(
    embedder, path=None, checkpoint=None, warn: Callable[[str], None] = lambda m: None
) -> Optional[Tuple[Calibration, str]]:
    """The calibration of `embedder` (module docstring: given file, ONNX metadata, exp dir) -> (it, where), or None."""
    where = None
    if path is not None:
        cal, where = read_calibration(path), str(path)
    elif getattr(embedder, "calibration", None) is not None:
        cal, where = embedder.calibration, f"in {embedder.path}"
    elif checkpoint is not None:
        return exp_calibration(checkpoint, embedder.model_id, warn)
    else:
        return None
    cal.check_model(embedder.model_id, where)
    return cal, where


def decide(
    emb: np.ndarray, seconds: Tuple[float, float], found: Optional[Tuple[Calibration, str]], far: float, prior: float
) -> Decision:
    """Two embeddings `emb (2, D)` of files of `seconds` and a calibration (`find_calibration`) -> the Decision at
    `far`. Without a calibration, a CalibrationError: the caller uses a cosine threshold instead."""
    a, b = np.asarray(emb[0], np.float64), np.asarray(emb[1], np.float64)
    norms = (float(np.linalg.norm(a)), float(np.linalg.norm(b)))
    score = float(a @ b / max(norms[0] * norms[1], 1e-12))
    if found is None:
        raise CalibrationError("no calibration for this model")
    cal, where = found
    llr = float(cal.llr([score], seconds[0], seconds[1], norms[0], norms[1])[0])
    threshold = cal.threshold(far)
    probability = 1.0 / (1.0 + math.exp(-min(max(llr + math.log(prior / (1 - prior)), -700.0), 700.0)))
    source = f"{where}: {cal.describe()}"
    return Decision(score, threshold, llr >= threshold, source, llr, probability, far, prior)


def verify_files(embedder, a: str, b: str, calibration=None, checkpoint=None, far: float = 0.01, prior: float = 0.5):
    """Two audio files -> their Decision with the embedder's calibration (`find_calibration`; `calibration`: a file
    that overrides it). No calibration found is a CalibrationError: give one, or decide on the cosine yourself."""
    waves = [read_wave(embedder, a), read_wave(embedder, b)]
    emb = embedder.embed_waves(waves)
    found = find_calibration(embedder, calibration, checkpoint)
    return decide(emb, tuple(len(w) / embedder.sample_rate for w in waves), found, far, prior)
