"""Output files of the scoring step: the scores file, the metrics JSON, the result line, the table.

`eer_text` and `counts_text` are how an EER is said everywhere (result line, table, the recipes' closing lines
from P.json): with its confidence interval and the trials and speakers behind it.

`write_scores` formats whole blocks of trials with numpy (ids from the zero-padded id bytes of the
index, the score as fixed-point `%.6f` digits) and drops the padding bytes, so writing 10 M lines makes
no Python string per line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Sequence

import numpy as np

from speakerlab.dataio.tables.trials import TrialList
from speakerlab.outputs import output_file, write_text
from speakerlab.scoring.interval import CI_MIN_SPEAKERS

_LABEL_TEXT = np.zeros((2, 9), np.uint8)
_LABEL_TEXT[0, :9] = np.frombuffer(b"nontarget", np.uint8)
_LABEL_TEXT[1, :6] = np.frombuffer(b"target", np.uint8)
_POW10 = 10 ** np.arange(18, dtype=np.int64)
_PAIRS = np.array([[48 + i // 10, 48 + i % 10] for i in range(100)], np.uint8)  # "00".."99"


def _fixed6(scores: np.ndarray) -> np.ndarray:
    """`(n,)` finite scores with |s| < 1e12 -> `(n, w)` uint8 text of `%.6f`, zero bytes as padding."""
    q = np.rint(np.abs(scores.astype(np.float64)) * 1e6).astype(np.int64)
    whole = q // 1_000_000
    frac = (q - whole * 1_000_000).astype(np.int32)  # int32: cheaper divisions for the six decimals
    k = max(1, len(str(int(whole.max(initial=0)))))
    out = np.zeros((len(q), 1 + k + 1 + 6), np.uint8)
    out[:, 0] = np.where(np.signbit(scores), ord("-"), 0)  # as %.6f, "-0.000000" included
    for j in range(k):
        p = _POW10[k - 1 - j]
        digit = (whole // p) % 10 + 48
        # Leading zeros are padding (dropped), except the units digit.
        out[:, 1 + j] = digit if j == k - 1 else np.where(whole >= p, digit, 0)
    out[:, 1 + k] = ord(".")
    hi = frac // 10000
    rest = frac - hi * 10000
    mid = rest // 100
    out[:, 2 + k : 4 + k] = _PAIRS[hi]
    out[:, 4 + k : 6 + k] = _PAIRS[mid]
    out[:, 6 + k : 8 + k] = _PAIRS[rest - mid * 100]
    return out


def write_scores(path, trials: TrialList, scores: np.ndarray, block: int = 1 << 16) -> Path:
    """`enrol test score target|nontarget` lines, in trial-list order, written atomically.

    Blocks of `block` lines (64 k: their arrays are reused from the allocator's heap; blocks of
    millions would be fresh memory every time, a page fault per 4 kB)."""
    path = Path(path)
    chars = trials.index.chars
    with output_file(path, "wb") as f:
        for lo in range(0, len(trials), block):
            sl = slice(lo, lo + block)
            s = scores[sl]
            if not np.isfinite(s).all() or np.abs(s).max(initial=0) >= 1e12:  # rare: plain formatting
                ids = trials.index.ids
                f.write(
                    "".join(
                        f"{ids[a]} {ids[b]} {v:.6f} {'target' if t else 'nontarget'}\n"
                        for a, b, v, t in zip(trials.enrol[sl], trials.test[sl], s, trials.target[sl])
                    ).encode()
                )
                continue
            n = len(s)
            parts = [
                chars[trials.enrol[sl]],
                np.full((n, 1), 32, np.uint8),
                chars[trials.test[sl]],
                np.full((n, 1), 32, np.uint8),
                _fixed6(s),
                np.full((n, 1), 32, np.uint8),
                _LABEL_TEXT[trials.target[sl].view(np.uint8)],
                np.full((n, 1), 10, np.uint8),
            ]
            rows = np.concatenate(parts, axis=1)
            f.write(rows[rows != 0])  # the padding bytes dropped; written from the array, no bytes copy
    return path


def _rate(p: float) -> str:
    return f"{p * 100:g}%"


def _interval(summary: Dict) -> str:
    ci = summary.get("eer_ci")
    return f"{ci['level'] * 100:g}% CI {ci['low'] * 100:.2f}-{ci['high'] * 100:.2f}%" if ci else ""


def eer_text(summary: Dict) -> str:
    """'5.52% (95% CI 3.90-7.41%)' of a list's summary; '66.67% (no interval: 2 speakers)' with too few speakers
    for one (interval.CI_MIN_SPEAKERS); the bare EER when no interval was asked for."""
    ci = _interval(summary)
    if not ci and summary.get("n_speakers", CI_MIN_SPEAKERS) < CI_MIN_SPEAKERS:
        ci = f"no interval: {summary['n_speakers']} speakers"
    return f"{summary['eer'] * 100:.2f}%" + (f" ({ci})" if ci else "")


def counts_text(summary: Dict) -> str:
    """'3000 trials (1500 target, 1500 nontarget, 20 speakers)': what stands behind the list's EER."""
    speakers = f", {summary['n_speakers']} speakers" if "n_speakers" in summary else ""
    return f"{summary['n_trials']} trials ({summary['n_target']} target, {summary['n_nontarget']} nontarget{speakers})"


def result_line(summary: Dict) -> str:
    """One line per list, as in `<out>.result`: counts, EER with its interval and threshold, minDCF at each
    p_target, the thresholds at the false-alarm rates of `operating_points` (+ Cllr, actDCF)."""
    points = summary["operating_points"]
    ci = _interval(summary)
    text = (
        f"{summary['trials']}: {counts_text(summary)} EER {summary['eer'] * 100:.2f}% "
        f"({ci + ', ' if ci else ''}threshold {points['eer']['threshold']:.4f})"
    )
    for p, v in summary["min_dcf"].items():
        text += f" minDCF(p_target={p}) {v:.4f}"
    for key, pt in points.items():
        if key.startswith("fa="):
            text += f" threshold(FA {_rate(float(key[3:]))}) {pt['threshold']:.4f} (miss {pt['p_miss'] * 100:.2f}%)"
    if "cllr" in summary:
        text += f" Cllr {summary['cllr']:.4f}"
        for p, v in summary["act_dcf"].items():
            text += f" actDCF(p_target={p}) {v:.4f}"
    return text


def write_json(path, summary: Dict) -> Path:
    path = Path(path)
    write_text(path, json.dumps(summary, indent=2) + "\n")
    return path


def markdown_table(summaries: Sequence[Dict]) -> str:
    """One row per list: name, counts, EER (%) and its threshold, minDCF at each p_target, the thresholds
    at the false-alarm rates (1 %, 0.1 %), Cllr and actDCF when calibrated."""
    p_targets: List[str] = list(summaries[0]["min_dcf"]) if summaries else []
    fa_keys = [k for k in summaries[0]["operating_points"] if k.startswith("fa=")] if summaries else []
    calibrated = any("cllr" in s for s in summaries)
    level = next((s["eer_ci"]["level"] for s in summaries if s.get("eer_ci")), None)
    head = ["list", "trials", "target", "EER (%)"]
    head += [f"{level * 100:g}% CI (%)", "speakers"] if level else []
    head += ["threshold at EER"] + [f"minDCF({p})" for p in p_targets]
    head += [f"threshold at FA {_rate(float(k[3:]))}" for k in fa_keys]
    if calibrated:
        head += ["Cllr"] + [f"actDCF({p})" for p in p_targets]
    head.append("scoring")
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * len(head)) + "|"]
    for s in summaries:
        points = s["operating_points"]
        row = [s["name"], str(s["n_trials"]), str(s["n_target"]), f"{s['eer'] * 100:.2f}"]
        if level:
            ci = s.get("eer_ci")
            row += [f"{ci['low'] * 100:.2f}-{ci['high'] * 100:.2f}" if ci else "-", str(s.get("n_speakers", "-"))]
        row += [f"{points['eer']['threshold']:.4f}"] + [f"{s['min_dcf'][p]:.4f}" for p in p_targets]
        row += [f"{points[k]['threshold']:.4f}" for k in fa_keys]
        if calibrated:
            row += [f"{s['cllr']:.4f}" if "cllr" in s else "-"]
            row += [f"{s['act_dcf'][p]:.4f}" if "cllr" in s else "-" for p in p_targets]
        row.append(s["scoring"]["method"])
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"
