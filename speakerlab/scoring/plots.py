"""Pictures of a scored trial list: the DET curve and the target / nontarget score histograms.

Both are PNG files of WIDTH x HEIGHT pixels (640 x 480), drawn with matplotlib's Agg backend (no
display needed), through matplotlib's object interface (a `Figure` on an Agg canvas: no pyplot, whose
import alone costs about a second), imported on the first picture only. The DET curve plots p_miss
against p_fa on normal-deviate (probit) axes, as is usual for speaker verification, with the EER and
minDCF points marked; it is drawn from the thinned curve (`metrics.thin_curve`, a few thousand points),
so its cost does not grow with the number of trials; the histograms are counted with numpy first.
"""

from __future__ import annotations

from pathlib import Path
from statistics import NormalDist
from typing import Dict

import numpy as np

from speakerlab.outputs import output_file
from speakerlab.scoring.metrics import thin_curve

WIDTH, HEIGHT, DPI = 640, 480, 100
_TICKS = [0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 0.9, 0.95]
_CLIP = (5e-4, 0.97)  # axis range in probability


def _figure():
    """A WIDTH x HEIGHT figure on an Agg canvas (files only: no window, no pyplot state) -> (fig, ax)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(WIDTH / DPI, HEIGHT / DPI), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def _probit(p: np.ndarray) -> np.ndarray:
    inv = NormalDist().inv_cdf
    return np.array([inv(float(v)) for v in np.clip(p, *_CLIP)])


def plot_det(
    p_miss: np.ndarray,
    p_fa: np.ndarray,
    path,
    title: str,
    eer: float,
    min_dcf: Dict[float, float],
    max_points: int = 4000,
) -> Path:
    """DET curve of error curves `p_miss`, `p_fa` (K,) (from `metrics.verification_metrics`, best thinned
    there) -> PNG at path; curves of more than `max_points` points are thinned here."""
    pm, pf = thin_curve(np.asarray(p_miss), np.asarray(p_fa), max_points, _CLIP[0])
    fig, ax = _figure()
    ax.plot(_probit(pf), _probit(pm), color="C0", lw=1.5, label="DET")
    ax.plot(_probit(np.array([eer])), _probit(np.array([eer])), "o", color="C3", label=f"EER {eer * 100:.2f}%")
    dcf_txt = ", ".join(f"minDCF({p:g}) {v:.3f}" for p, v in min_dcf.items())
    lo, hi = NormalDist().inv_cdf(_CLIP[0]), NormalDist().inv_cdf(_CLIP[1])
    ax.plot([lo, hi], [lo, hi], ls=":", color="grey", lw=0.8)
    ticks = _probit(np.array(_TICKS))
    labels = [f"{t * 100:g}" for t in _TICKS]
    ax.set_xticks(ticks, labels)
    ax.set_yticks(ticks, labels)
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("false alarm rate (%)")
    ax.set_ylabel("miss rate (%)")
    ax.set_title(f"{title}\n{dcf_txt}", fontsize=9)
    ax.grid(True, lw=0.5, alpha=0.5)
    ax.legend(loc="upper right", fontsize=8)
    return _save(fig, path)


def plot_histogram(scores: np.ndarray, labels: np.ndarray, path, title: str, bins: int = 100) -> Path:
    """Target and nontarget score densities of `scores (N,)`, `labels (N,)` -> PNG at path."""
    scores = np.asarray(scores)
    labels = np.asarray(labels, bool)
    lo, hi = float(scores.min()), float(scores.max())
    hi = hi if hi > lo else lo + 1.0
    edges = np.linspace(lo, hi, bins + 1)
    # Bin numbers by arithmetic (as np.histogram's equal-width path), then one bincount per class; the
    # drawing (stairs) costs the same for any number of trials.
    b = ((scores - np.float32(lo)) * np.float32(bins / (hi - lo))).astype(np.int32)
    np.clip(b, 0, bins - 1, out=b)
    b += labels.astype(np.int32) * bins
    counts = np.bincount(b, minlength=2 * bins).reshape(2, bins).astype(np.float64)
    fig, ax = _figure()
    for row, name, colour in ((0, "nontarget", "C0"), (1, "target", "C1")):
        n = counts[row].sum()
        density = counts[row] / (n * np.diff(edges)) if n else counts[row]
        ax.stairs(density, edges, fill=True, alpha=0.5, color=colour, label=f"{name} ({int(n)})")
    ax.set_xlabel("score")
    ax.set_ylabel("density")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    return _save(fig, path)


def _save(fig, path) -> Path:
    path = Path(path)
    with output_file(path, "wb") as f:  # no bbox_inches="tight": the size stays WIDTH x HEIGHT
        fig.savefig(f, dpi=DPI, format=path.suffix[1:] or "png")
    return path
