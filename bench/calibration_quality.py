"""Does a signal-quality measure as QMF side information make one calibration hold across the stress conditions?

    python bench/calibration_quality.py --data egs/mini/data --work /tmp/calib_bench \
        --degraded tel gsm mp3 noise5 reverb --noise-bank egs/mini/data/musan_rirs/bank

An experiment on the condition sets bench/calibration.py cached under `--work` (run it first, with the same
conditions and seed): not the shipped calibration, whose features are the cosine, durations and embedding norms.

Two quality measures of each file, computed from its (cropped or degraded) wave as bench/calibration.py embedded it:
    bandwidth  log10 of the share of spectral power above 3.5 kHz (telephone band and low-rate codecs remove it)
    dynamics   the 95th less the 10th percentile of 32 ms frame energies, dB (noise fills the pauses; reverberation
               smears them)
Per trial, as for durations: the minimum and maximum of each over the two sides (a symmetric choice).

QMFs fitted at the first `--p-target`, each measured on every condition's test trials (never fitted on): the shipped
features fitted on clean val only (the durations; what a calibration measured on clean data does to degraded data);
fitted on the val trials of every condition pooled, with the shipped features, then with the quality measures, then
with the condition itself known (an offset and a cosine weight per condition: what perfect side information could
give one pooled calibration); and one calibration per condition, fitted on that condition's val trials alone.
Prints per fit and condition Cllr, min-Cllr, actDCF / minDCF at the priors, and the FAR at the fit's 1 % threshold.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from speakerlab.dataio.audio import read_audio
from speakerlab.dataio.tables.lists import read_wav_scp
from speakerlab.dataio.waveform.degrade import degrade, rng_for
from speakerlab.dataio.waveform.noise_bank import NoiseBank
from speakerlab.scoring.calibrate import list_metrics, score_lists
from speakerlab.scoring.calibration import QMF, read_durations
from speakerlab.scoring.calibration_file import operating_points

RATE = 16000  # egs/mini's, the model's
FRAME = 512  # 32 ms at 16 kHz
HIGH_HZ = 3500.0


def quality(wave: np.ndarray, rate: int) -> tuple:
    """`wave (samples,)` -> (bandwidth, dynamics): module docstring."""
    n = len(wave) // FRAME
    frames = np.asarray(wave[: n * FRAME], np.float64).reshape(n, FRAME)
    power = (np.abs(np.fft.rfft(frames * np.hanning(FRAME), axis=1)) ** 2).mean(axis=0)
    freqs = np.fft.rfftfreq(FRAME, 1.0 / rate)
    bandwidth = np.log10(power[freqs > HIGH_HZ].sum() / max(power.sum(), 1e-20) + 1e-6)
    energy = 10 * np.log10((frames**2).mean(axis=1) + 1e-10)
    return float(bandwidth), float(np.percentile(energy, 95) - np.percentile(energy, 10))


def quality_file(data: Path, cond: str, out: Path, bank, seed: int) -> None:
    """out/utt2quality of the condition set (ids suffixed as bench/calibration.py's), unless there."""
    if (out / "utt2quality").exists():
        return
    scp = read_wav_scp(data / "wav.scp")
    lines = []
    for u, (_, path) in scp.items():
        wave, rate = read_audio(path, RATE), RATE
        if cond.endswith("s") and cond[:-1].replace(".", "", 1).isdigit():
            wave = wave[: int(float(cond[:-1]) * rate)]
        elif cond != "full":
            wave = degrade(wave, rate, cond, rng_for(u, cond, seed), bank)
        b, d = quality(wave, rate)
        lines.append(f"{u}-{cond} {b:.4f} {d:.3f}\n")
    (out / "utt2quality").write_text("".join(lines))


def with_quality(scored, q: dict) -> list:
    """Each list's QMF features `(n, F)` with the min and max over the sides of both quality measures and the cosine
    times each minimum -> (n, F+6)."""
    out = []
    for (scorer, tl), feats in zip(scored.lists, scored.features):
        per_utt = np.array([q[u] for u in scorer.index.ids])  # (M, 2)
        e, t = per_utt[tl.enrol], per_utt[tl.test]
        low, high = np.minimum(e, t), np.maximum(e, t)
        # and the cosine times each side's worst quality: a degraded side changes the score's scale, not only its
        # offset (a linear QMF can only shift the LLR by a feature, not stretch it)
        out.append(np.hstack([feats, low, high, feats[:, :1] * low]))
    return out


def condition_known(feats: np.ndarray, k: int, n: int) -> np.ndarray:
    """The upper bound of side information: list `k` of `n` conditions -> (cosine, one-hot condition (n - 1), cosine
    times the one-hot) `(rows, 2n - 1)`: an offset and a cosine weight of its own per condition in one QMF."""
    hot = np.zeros((len(feats), n - 1))
    if k:
        hot[:, k - 1] = 1.0
    return np.hstack([feats[:, :1], hot, feats[:, :1] * hot])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, type=Path, help="egs/mini's data dir (val/ and test/)")
    ap.add_argument("--work", required=True, type=Path, help="bench/calibration.py's --work")
    ap.add_argument("--durations", nargs="+", default=["1s", "2s", "4s", "full"], help="its duration sets")
    ap.add_argument("--degraded", nargs="+", required=True, help="its --degraded conditions")
    ap.add_argument("--noise-bank", help="its --noise-bank")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--p-target", type=float, nargs="+", default=[0.01, 0.05])
    args = ap.parse_args(argv)
    print("command: python bench/calibration_quality.py " + " ".join(sys.argv[1:] if argv is None else argv))
    t0 = time.time()
    bank = NoiseBank(args.noise_bank) if args.noise_bank else None
    conds = [*args.durations, *args.degraded]
    for split in ("val", "test"):
        for c in conds:
            quality_file(args.data / split, c, args.work / f"{split}_{c}", bank, args.seed)
    w = args.work
    dirs = [str(w / f"{s}_{c}") for c in conds for s in ("val", "test")]
    durations = read_durations(dirs)
    q = {}
    for d in dirs:
        for line in (Path(d) / "utt2quality").read_text().splitlines():
            u, b, dyn = line.split()
            q[u] = (float(b), float(dyn))
    fit = score_lists(
        [str(w / f"val_{c}" / "trials") for c in conds], [str(w / f"val_{c}.npz") for c in conds], durations, ""
    )
    held = score_lists(
        [str(w / f"test_{c}" / "trials") for c in conds], [str(w / f"test_{c}.npz") for c in conds], durations, ""
    )
    for s in (fit, held):  # quality of the clean enrolment side: its "-full" ids are in every degraded set's .npz
        for scorer, _ in s.lists:
            for u in scorer.index.ids:
                if u not in q:
                    raise SystemExit(f"no quality for {u}")
    n_clean = len(args.durations)
    every = list(range(len(conds)))
    known = [condition_known(f, k, len(conds)) for k, f in enumerate(fit.features)]
    known_held = [condition_known(f, k, len(conds)) for k, f in enumerate(held.features)]
    fits = {  # name: (features of the fitting lists, of the held-out lists, the fitting lists of each condition)
        "shipped features, fitted on clean val": (fit.features, held.features, [list(range(n_clean))] * len(conds)),
        "shipped features, conditions pooled": (fit.features, held.features, [every] * len(conds)),
        "+ quality measures, conditions pooled": (with_quality(fit, q), with_quality(held, q), [every] * len(conds)),
        "condition known (its own offset and cosine weight), pooled": (known, known_held, [every] * len(conds)),
        "one calibration per condition (its own val only)": (fit.features, held.features, [[k] for k in every]),
    }
    priors = [f"{p:g}" for p in args.p_target]
    head = (
        "| test condition | Cllr | min-Cllr | "
        + " | ".join(f"actDCF / minDCF ({p})" for p in priors)
        + " | FAR at 1 % |"
    )
    for name, (fit_x, held_x, lists) in fits.items():
        print(f"\n### {name}\n\n{head}\n" + "|---" * (4 + len(priors)) + "|")
        for k, (c, x, (_, tl)) in enumerate(zip(conds, held_x, held.lists)):
            y = np.concatenate([fit.target[j] for j in lists[k]])
            x_fit = np.concatenate([fit_x[j] for j in lists[k]])
            qmf = QMF(prior=args.p_target[0]).fit(x_fit, y)
            raw = np.concatenate([fit.raw[j] for j in lists[k]])
            point = operating_points(qmf.llr(x_fit), raw, y)["far=0.01"]
            llr = qmf.llr(x)
            m = list_metrics(llr, tl.target, args.p_target)
            dcf = " | ".join(
                f"{m['act_dcf'][p]:.3f} / {m['min_dcf'][p]:.3f} = {m['act_dcf'][p] / m['min_dcf'][p]:.2f}"
                for p in priors
            )
            far = float((llr[~tl.target] >= point["llr"]).mean())
            print(f"| {c} | {m['cllr']:.3f} | {m['min_cllr']:.3f} | {dcf} | {100 * far:.2f} % |")
    print(f"\n({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
