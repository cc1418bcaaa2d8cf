"""The calibration of one model as a file: what turns its cosine into a log likelihood ratio, where it came from and
the operating points it implies. `speakerlab-calibrate` writes it (`<exp>/calibration.json`, beside the
checkpoints), `speakerlab-export --waveform` copies it into the ONNX metadata, and `speakerlab-verify` /
`speakerlab-identify` read it. numpy only: the torch-free runtime reads it too.

    cal = read_calibration("exp/mini/calibration.json")
    cal.check_model(embedder.model_id, "exp/mini/calibration.json")    # a CalibrationError when another model's
    llr = cal.llr(scores, dur_e, dur_t, norm_e, norm_t)                  # (n,) natural-log LLRs
    t = cal.threshold(0.01)                                              # the LLR threshold at FAR 1 %

Format (JSON, `format` FORMAT; keys below; a file of another format or with a key missing is a CalibrationError
naming the file):
    model_id          the content digest of the checkpoint whose embeddings it was fitted on (never empty)
    model             that checkpoint, as the embeddings named it
    features, qmf     the QMF's features (speakerlab.scoring.calibration.FEATURES or FEATURES_NO_DUR) and its
                      prior, standardisation (mean, std) and weights (theta, the bias last)
    fitted_on         the trial lists and embeddings files, trial and speaker counts, sha256 of each list
    priors            the p_target values of the reported costs
    metrics           {list name: n_trials, n_target, n_nontarget, eer, cllr, min_cllr, act_dcf, min_dcf, and on
                      held-out lists the FAR measured at the stored FAR thresholds with its interval}
    operating_points  {"eer" | "far=0.01" | "far=0.001": {"llr", "score", "p_miss", "p_fa", "nontargets"}}: the
                      threshold on the calibrated LLR (and, separately, on the raw cosine) measured on the fitting
                      lists, with the miss and false-alarm rates there; a FAR below one nontarget trial in the
                      lists is not measurable and its thresholds are null
    far_curve         [[far, llr threshold], ...] on a log grid of FARs, the measurable ones, falling: `threshold`
                      interpolates it (log FAR) for FARs between the stored points
    open_set          (optional) the "unknown" threshold measured on the fitting lists' own impostor maxima over
                      galleries of their speakers (speakerlab.scoring.open_set): n_gallery, enrol_files, n_probes,
                      curve [[fpir, llr threshold], ...]; `open_set_threshold` reads it

Why LLR thresholds as well as a calibrated LLR: a Bayes threshold (accept when llr >= log((1 - p) / p)) fixes a
cost, not a false-accept rate; a deployment asked for "1 in 100 impostors accepted" needs the threshold that gave
that rate on data like its own, and the file says on which data it was measured.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from speakerlab.outputs import write_text
from speakerlab.scoring.calibration import FEATURES, FEATURES_NO_DUR, QMF, qmf_features
from speakerlab.scoring.metrics import error_rates, fa_point

FORMAT = "speakerlab.calibration/1"
FAR_POINTS = (0.01, 0.001)  # stored operating points besides the EER
FAR_GRID = np.geomspace(0.5, 1e-6, 57)  # the curve's FARs: 8 per decade
OPTIONAL = ("open_set",)  # keys a file written before they existed may lack


class CalibrationError(ValueError):
    """A calibration file that cannot be used as asked (another model's, another format, a FAR it cannot give)."""


def file_digest(path) -> str:
    """sha256 of a file's bytes (hex): which version of a trial list a calibration was fitted on."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _finite(x: float) -> Optional[float]:
    return float(x) if math.isfinite(x) else None


def operating_points(llr: np.ndarray, raw: np.ndarray, target: np.ndarray) -> Dict[str, Dict]:
    """The stored points (EER, FAR_POINTS) of LLRs `llr (n,)` and raw scores `raw (n,)` of the same trials:
    each {"llr", "score", "p_miss", "p_fa", "nontargets"} (the rates of the LLR threshold; None where the FAR is
    below one nontarget trial)."""
    n_non = int((~np.asarray(target, bool)).sum())
    curves = {"llr": error_rates(llr, target), "score": error_rates(raw, target)}
    out = {}
    for name, rate in [("eer", None), *[(f"far={r:g}", r) for r in FAR_POINTS]]:
        point: Dict[str, Optional[float]] = {}
        for unit, (p_miss, p_fa, thr) in curves.items():
            if rate is None:  # the EER point: where miss and false alarm cross
                k = int(np.argmin(np.abs(p_miss[:-1] - p_fa[:-1])))
                p = {"threshold": float(thr[k]), "p_miss": float(p_miss[k]), "p_fa": float(p_fa[k])}
            elif rate * n_non < 1:  # no nontarget trial could be accepted at this rate: a p_fa of 0 says nothing
                p = {"threshold": math.inf, "p_miss": None, "p_fa": None}
            else:
                p = fa_point(p_miss, p_fa, thr, rate)
            point[unit] = _finite(p["threshold"])
            if unit == "llr":
                point.update(p_miss=p["p_miss"], p_fa=p["p_fa"])
        point["nontargets"] = n_non
        out[name] = point
    return out


def far_curve(llr: np.ndarray, target: np.ndarray) -> List[List[float]]:
    """[[far, llr threshold], ...] for the FARs of FAR_GRID that the list's nontargets can measure (at least one
    nontarget trial at or above the threshold), falling FAR."""
    p_miss, p_fa, thr = error_rates(llr, target)
    n_non = int((~np.asarray(target, bool)).sum())
    rows = []
    for far in FAR_GRID:
        if far * n_non < 1:
            break
        t = fa_point(p_miss, p_fa, thr, float(far))["threshold"]
        if math.isfinite(t):
            rows.append([float(far), float(t)])
    return rows


def fpir_target(fpir: float, speakers: int, n_gallery: int) -> float:
    """The FPIR of the calibration's `n_gallery`-speaker galleries that gives `fpir` over `speakers`: 1 - (1 -
    fpir)^(n_gallery / speakers), the galleries combined as if independent (speakerlab.scoring.open_set)."""
    return 1.0 - (1.0 - fpir) ** (n_gallery / max(speakers, 1))


def curve_threshold(open_set: Dict, fpir: float, speakers: int) -> Optional[float]:
    """The LLR threshold of `fpir` over a gallery of `speakers` from a stored open-set curve (the file's `open_set`,
    speakerlab.scoring.open_set.open_set_curve), linear in log FPIR between its points; None where the curve did not
    measure that FPIR (too few calibration probes)."""
    curve = open_set.get("curve") or []
    f = fpir_target(fpir, speakers, int(open_set["n_gallery"]))
    fpirs = [c[0] for c in curve]
    if not fpirs or not fpirs[-1] <= f <= fpirs[0]:
        return None
    x = np.log(fpirs)[::-1]
    y = np.array([c[1] for c in curve])[::-1]
    return float(np.interp(math.log(f), x, y))


@dataclass
class Calibration:
    """One model's calibration (the module docstring's format)."""

    model_id: str
    model: str
    features: List[str]
    qmf: Dict[str, object]
    fitted_on: Dict[str, object]
    priors: List[float]
    metrics: Dict[str, Dict] = field(default_factory=dict)
    operating_points: Dict[str, Dict] = field(default_factory=dict)
    far_curve: List[List[float]] = field(default_factory=list)
    open_set: Dict[str, object] = field(default_factory=dict)
    format: str = FORMAT

    @classmethod
    def from_qmf(cls, qmf: QMF, model_id: str, model: str, fitted_on: Dict, priors: Sequence[float]) -> "Calibration":
        if not model_id:
            raise CalibrationError("a calibration needs the model's digest (embeddings made by speakerlab-extract)")
        params = {"prior": qmf.prior, "mean": qmf.mean.tolist(), "std": qmf.std.tolist(), "theta": qmf.theta.tolist()}
        return cls(model_id, model, list(qmf.names), params, fitted_on, [float(p) for p in priors])

    def to_qmf(self) -> QMF:
        q = QMF(prior=float(self.qmf["prior"]))
        q.mean, q.std = np.asarray(self.qmf["mean"], np.float64), np.asarray(self.qmf["std"], np.float64)
        q.theta, q.names = np.asarray(self.qmf["theta"], np.float64), list(self.features)
        return q

    @property
    def uses_durations(self) -> bool:
        return self.features == FEATURES

    def llr(self, scores, dur_e=None, dur_t=None, norm_e=None, norm_t=None) -> np.ndarray:
        """Trials of cosine `scores (n,)`, the durations in seconds of their two sides `dur_e`, `dur_t` (n,) (needed
        when the calibration uses durations) and the raw embedding norms `norm_e`, `norm_t` (n,) -> `(n,)` float32
        LLRs (natural log)."""
        scores = np.atleast_1d(np.asarray(scores, np.float64))
        n = len(scores)
        idx = np.arange(n)
        norms = np.concatenate([np.broadcast_to(norm_e, n), np.broadcast_to(norm_t, n)]).astype(np.float64)
        logdur = None
        if self.uses_durations:
            if dur_e is None or dur_t is None:
                raise CalibrationError("this calibration uses durations: give both sides' durations")
            logdur = np.log(np.concatenate([np.broadcast_to(dur_e, n), np.broadcast_to(dur_t, n)]).astype(np.float64))
        return self.to_qmf().llr(qmf_features(scores, idx, idx + n, norms, logdur))

    def threshold(self, far: float) -> float:
        """The LLR threshold whose false-alarm rate on the fitting lists was `far`: a stored point, else linear in
        log FAR between the curve's neighbours; a FAR outside the measured range is a CalibrationError."""
        stored = self.operating_points.get(f"far={far:g}")
        if stored is not None and stored.get("llr") is not None:
            return float(stored["llr"])
        fars = [f for f, _ in self.far_curve]
        if not fars or not fars[-1] <= far <= fars[0]:
            span = f"{fars[-1]:g}..{fars[0]:g}" if fars else "none"
            n_non = self.fitted_on.get("n_nontarget", "?")
            raise CalibrationError(
                f"FAR {far:g} was not measurable on the calibration lists ({n_non} nontarget trials; "
                f"measured FARs: {span})"
            )
        x = np.log([f for f, _ in self.far_curve])[::-1]
        y = np.array([t for _, t in self.far_curve])[::-1]
        return float(np.interp(math.log(far), x, y))

    def open_set_threshold(self, fpir: float, speakers: int) -> Optional[float]:
        """The LLR threshold that names a share `fpir` of never-enrolled speakers' files over a gallery of
        `speakers`, from the measured impostor maxima (speakerlab.scoring.open_set); None without them or where
        they did not measure that FPIR."""
        return curve_threshold(self.open_set, fpir, speakers) if self.open_set else None

    def check_model(self, model_id: str, where: str) -> None:
        """A CalibrationError in one line unless the calibration was fitted on embeddings of `model_id`."""
        if not model_id:
            raise CalibrationError(
                f"{where}: the model has no digest to match this calibration against (an int8 or foreign file?)"
            )
        if model_id != self.model_id:
            raise CalibrationError(
                f"{where}: calibration of model {self.model_id[:12]}, not of this model {model_id[:12]}: "
                "a calibration fitted on another model's scores does not carry over; run speakerlab-calibrate for it"
            )

    def describe(self) -> str:
        lists = ", ".join(str(t) for t in self.fitted_on.get("trials", []))
        return f"{self.fitted_on.get('n_trials', '?')} trials of {lists}, model {self.model_id[:12]}"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, where: str) -> "Calibration":
        try:
            d = json.loads(text)
        except ValueError as e:
            raise CalibrationError(f"{where}: not a calibration file (not JSON: {e})") from None
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            got = d.get("format") if isinstance(d, dict) else type(d).__name__
            raise CalibrationError(f"{where}: calibration format {got!r} is not {FORMAT!r}")
        names = [k for k in cls.__dataclass_fields__]
        missing = [k for k in names if k not in d and k not in OPTIONAL]
        unknown = [k for k in d if k not in names]
        if missing or unknown:
            raise CalibrationError(f"{where}: calibration keys missing {missing}, unknown {unknown}")
        cal = cls(**d)
        if cal.features not in (FEATURES, FEATURES_NO_DUR) or len(cal.qmf.get("theta", [])) != len(cal.features) + 1:
            raise CalibrationError(f"{where}: calibration features {cal.features} do not match its weights")
        return cal


def read_calibration(path) -> Calibration:
    """A calibration file -> Calibration (CalibrationError naming it when it is not one)."""
    path = Path(path)
    if not path.is_file():
        raise CalibrationError(f"{path}: calibration file does not exist")
    return Calibration.from_json(path.read_text(), str(path))


def write_calibration(path, cal: Calibration) -> None:
    """The file, whole or not at all (speakerlab.outputs)."""
    write_text(path, cal.to_json() + "\n")
