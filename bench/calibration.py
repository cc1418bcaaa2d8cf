"""Calibration and open-set identification of a trained egs/mini model, measured on held-out lists, clean and under
the stress conditions.

    python bench/calibration.py --data egs/mini/data --model egs/mini/exp/campplus --work /tmp/calib_bench \
        --degraded tel gsm mp3 noise5 reverb --noise-bank egs/mini/data/musan_rirs/bank

Conditions: the first 1, 2, 4 s of every file and the whole file (both sides), and each `--degraded` condition of
speakerlab.dataio.waveform.degrade on the test side of every trial, the enrolment side the clean whole file, seeded
per utterance (`--seed`) as speakerlab-stress degrades it. The val and test utterances are embedded once per condition
and cached under `--work` (a rerun takes seconds).

Calibration (speakerlab-calibrate, durations as side information, fitted at the first `--p-target` unless
`--fit-prior`): on the val trials of the duration conditions pooled (the listed trials, or every pair of val files
with `--cal-pairs all`), then, with `--degraded`, on the val trials of every condition pooled. Each is measured on
every condition's test trials, never fitted on: Cllr, min-Cllr, actDCF and minDCF at the priors (at the first, how
far actDCF / minDCF moves over speaker resamples: `ratio_interval`), and the FAR measured at the stored 1 %
threshold with its speaker-bootstrap interval. One markdown table per fit.

Open set (with the clean fit): the test speakers sorted by name, every other one enrolled (its first `--enrol` whole
files in a gallery), the others never enrolled; every other whole test file is a probe
(speakerlab.identification.identify: mean calibrated LLR per speaker). Rank-1 rate: enrolled probes whose best
speaker is theirs. At FPIR 1 % and 5 %: the oracle threshold (set on the never-enrolled probes' best scores
themselves), the calibration's measured one (its open-set curve, speakerlab.scoring.open_set) and the analytic one
(identify.analytic_fpir_threshold), each with the FPIR it reached and the FNIR (enrolled probes not named correctly).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from speakerlab.dataio.tables.embeddings import write_embeddings
from speakerlab.dataio.tables.lists import read_utt2spk, read_wav_scp
from speakerlab.dataio.waveform.degrade import check_conditions, degrade, rng_for
from speakerlab.dataio.waveform.noise_bank import NoiseBank
from speakerlab.identification.gallery import Gallery
from speakerlab.identification.identify import analytic_fpir_threshold, speaker_scores
from speakerlab.inference import load_embedder
from speakerlab.scoring.calibrate import main as calibrate
from speakerlab.scoring.calibrate import score_lists
from speakerlab.scoring.calibration import read_durations
from speakerlab.scoring.calibration_file import read_calibration
from speakerlab.scoring.interval import trial_speakers


def trial_rows(data: Path, all_pairs: bool):
    """The trials of a data dir -> [(enrol, test, label)]: its `trials` file, or (`all_pairs`) every pair of its
    utterances (more calibration trials than a listed subset: the 1 % tail of a small val set)."""
    if not all_pairs:
        return [tuple(line.split()) for line in (data / "trials").read_text().splitlines() if line.strip()]
    u2s = {u: s for u, (_, s) in read_utt2spk(data / "utt2spk").items()}
    ids = sorted(u2s)
    return [(e, t, "target" if u2s[e] == u2s[t] else "nontarget") for i, e in enumerate(ids) for t in ids[i + 1 :]]


def is_crop(cond: str) -> bool:
    """A duration condition ("1s", "2.5s"), not a degradation."""
    return cond.endswith("s") and cond[:-1].replace(".", "", 1).isdigit()


def condition_set(embedder, data: Path, cond: str, work: Path, name: str, bank, seed: int, all_pairs: bool) -> Path:
    """The data dir `data` under one condition -> work/name (utt2spk, utt2dur, trials; ids suffixed by the
    condition) and work/name.npz, reused when there.

    `cond`: "Ns" (the first N seconds of every file, both sides), "full" (whole files), or a condition of
    speakerlab.dataio.waveform.degrade (the test side degraded, seeded per utterance as speakerlab-stress does; the
    enrolment side the clean whole file, as in the stress table: its .npz also holds the clean embeddings, name's
    "full" set made first). -> the trials file: work/name/trials (the listed trials), or trials_all (`all_pairs`)."""
    out = work / name
    tag = f"-{cond}"
    enrol_tag = tag if cond == "full" or is_crop(cond) else "-full"
    trials_file = out / ("trials_all" if all_pairs else "trials")
    out.mkdir(parents=True, exist_ok=True)
    text = "".join(f"{e}{enrol_tag} {t}{tag} {lab}\n" for e, t, lab in trial_rows(data, all_pairs))
    if not trials_file.exists() or trials_file.read_text() != text:
        trials_file.write_text(text)
    if (work / f"{name}.npz").exists():
        return trials_file
    scp = read_wav_scp(data / "wav.scp")
    u2s = {u: s for u, (_, s) in read_utt2spk(data / "utt2spk").items()}
    ids, rate = list(scp), embedder.sample_rate
    waves = []
    for u in ids:
        wave = embedder.read(scp[u][1])
        if is_crop(cond):
            wave = wave[: int(float(cond[:-1]) * rate)]
        elif cond != "full":
            wave = degrade(wave, rate, cond, rng_for(u, cond, seed), bank)
        waves.append(wave)
    emb = embedder.embed_waves(waves)
    keep_ids, keep_emb = [], np.zeros((0, emb.shape[1]), np.float32)
    if enrol_tag != tag:
        clean = np.load(work / f"{name.rsplit('_', 1)[0]}_full.npz")
        keep_ids, keep_emb = clean["ids"].tolist(), clean["embeddings"]
    (out / "utt2spk").write_text("".join(f"{u}{tag} {u2s[u]}\n" for u in ids))
    (out / "utt2dur").write_text("".join(f"{u}{tag} {len(w) / rate:.4f}\n" for u, w in zip(ids, waves)))
    all_ids = [*keep_ids, *(f"{u}{tag}" for u in ids)]
    write_embeddings(work / f"{name}.npz", all_ids, np.concatenate([keep_emb, emb]), model_id=embedder.model_id)
    return trials_file


def open_set(embedder, data: Path, cal, enrol: int, work: Path, fpirs=(0.01, 0.05)) -> str:
    """Open-set identification of the whole test files (module docstring) -> the report's lines: rank-1 rate, and
    per target FPIR the FNIR at the oracle threshold (set on the never-enrolled probes themselves), then the FPIR and
    FNIR reached at the calibration's measured threshold (its open-set curve) and at the analytic one."""
    full = np.load(work / "test_full.npz")
    ids = [u[: -len("-full")] for u in full["ids"].tolist()]
    emb = full["embeddings"]
    u2s = {u: s for u, (_, s) in read_utt2spk(data / "utt2spk").items()}
    dur = dict(line.split() for line in (work / "test_full" / "utt2dur").read_text().splitlines())
    seconds = np.array([float(dur[f"{u}-full"]) for u in ids])
    speakers = sorted({u2s[u] for u in ids})
    enrolled = set(speakers[::2])
    g = Gallery.empty(embedder.model_id, emb.shape[1])
    probes = []
    for s in speakers:
        rows = [i for i, u in enumerate(ids) if u2s[u] == s]
        if s in enrolled:
            g.add(s, [ids[i] for i in rows[:enrol]], emb[rows[:enrol]], seconds[rows[:enrol]])
            probes += rows[enrol:]
        else:
            probes += rows
    best, right, known = [], [], []
    for i in probes:
        names, scores = speaker_scores(g, cal, emb[i], seconds[i])
        k = int(np.argmax(scores))
        best.append(scores[k])
        right.append(names[k] == u2s[ids[i]])
        known.append(u2s[ids[i]] in enrolled)
    best, right, known = np.array(best), np.array(right), np.array(known)
    n = len(g.names())
    lines = [
        f"open set: {n} enrolled speakers ({enrol} whole files each, {int(known.sum())} probes), "
        f"{len(speakers) - n} never enrolled ({int((~known).sum())} probes): rank-1 {100 * right[known].mean():.1f} %"
    ]

    def reached(t: float) -> str:
        named = int((best[~known] >= t).sum())
        fnir = 1 - float((right[known] & (best[known] >= t)).mean())
        return f"FPIR {100 * named / (~known).sum():.1f} % ({named} of {int((~known).sum())}), FNIR {100 * fnir:.1f} %"

    unknown_best = np.sort(best[~known])
    for fpir in fpirs:
        allowed = int(np.floor(fpir * len(unknown_best)))  # never-enrolled probes that may pass
        oracle = np.nextafter(unknown_best[len(unknown_best) - 1 - allowed], np.inf)
        measured = cal.open_set_threshold(fpir, n)
        text = reached(measured) if measured is not None else "not measured"
        lines.append(
            f"  FPIR {100 * fpir:g} %: oracle threshold {reached(oracle)}; measured threshold {text}; "
            f"analytic threshold {reached(analytic_fpir_threshold(cal, fpir, n))}"
        )
    return "\n".join(lines)


def fit_and_measure(args, fit: Sequence[str], test: Sequence[str], out: Path, pairs: str):
    """speakerlab-calibrate fitted on the val sets `fit` (condition names) pooled, measured on the test sets `test`
    -> the Calibration (also at `out`)."""
    w = args.work
    cmd = [
        "--trials",
        *(str(w / f"val_{c}" / pairs) for c in fit),
        "--embeddings",
        *(str(w / f"val_{c}.npz") for c in fit),
    ]
    cmd += ["--eval-trials", *(str(w / f"test_{c}" / "trials") for c in test)]
    cmd += [
        "--eval-embeddings",
        *(str(w / f"test_{c}.npz") for c in test),
        "--eval-names",
        *(f"test {c}" for c in test),
    ]
    cmd += ["--durations", *(str(w / f"{s}_{c}") for c in dict.fromkeys([*fit, *test]) for s in ("val", "test"))]
    if args.fit_prior is not None:
        cmd += ["--fit-prior", str(args.fit_prior)]
    assert calibrate([*cmd, "--p-target", *map(str, args.p_target), "--out", str(out)]) == 0
    return read_calibration(out)


def ratio_interval(cal, work: Path, cond: str, p: float, replicates: int = 1000, seed: int = 0):
    """The 2.5 and 97.5 percentiles (low, high) of actDCF / minDCF at prior `p` of the calibration `cal` on the test
    list of `cond` over speaker resamples: each draws the list's speakers with replacement and weighs a target trial
    of s by its count c_s and a nontarget trial of s and t by c_s c_t (as scoring.interval does for the EER).

    How much the ratio moves with the test speakers, not an interval of the true ratio: every resample re-optimises
    minDCF on itself, which pushes its ratio up (the list's own ratio can sit at the range's low end)."""
    dirs = list(dict.fromkeys([work / f"test_{cond}", work / "test_full"]))
    scored = score_lists(
        [str(work / f"test_{cond}" / "trials")], [str(work / f"test_{cond}.npz")], read_durations(dirs), ""
    )
    scorer, tl = scored.lists[0]
    llr = cal.to_qmf().llr(scored.features[0]).astype(np.float64)
    spk = trial_speakers(tl, scorer.index)
    order = np.argsort(llr)
    llr, tar, e, t = llr[order], tl.target[order], spk.enrol[order], spk.test[order]
    counts = np.random.default_rng(seed).multinomial(spk.count, np.full(spk.count, 1 / spk.count), replicates)
    w = (counts[:, e] * np.where(tar, 1, counts[:, t])).astype(np.float64)  # (R, n): c_s, or c_s c_t
    w_tar, w_non = w * tar, w * ~tar
    n_tar, n_non = w_tar.sum(1, keepdims=True), w_non.sum(1, keepdims=True)
    # rejecting the first k trials in score order, k = 0..n: misses and false alarms
    miss = np.hstack([np.zeros((replicates, 1)), np.cumsum(w_tar, 1)]) / n_tar
    fa = 1 - np.hstack([np.zeros((replicates, 1)), np.cumsum(w_non, 1)]) / n_non
    norm = min(p, 1 - p)
    min_dcf = ((p * miss + (1 - p) * fa) / norm).min(axis=1)
    k = int(np.searchsorted(llr, np.log((1 - p) / p)))  # the Bayes threshold rejects the first k
    act = (p * miss[:, k] + (1 - p) * fa[:, k]) / norm
    ratio = act / min_dcf
    return tuple(float(x) for x in np.percentile(ratio, [2.5, 97.5]))


def table(cal, test: Sequence[str], priors: Sequence[str], work: Path) -> str:
    """One markdown row per test condition of a calibration's held-out metrics, with the speaker-bootstrap interval
    of actDCF / minDCF at the first prior."""
    costs = " | ".join(f"actDCF / minDCF ({p})" for p in priors).replace(")", "; the ratio over speaker resamples)", 1)
    rows = [f"| test condition | trials | EER % | Cllr | min-Cllr | {costs} | FAR at the 1 % threshold (95 % CI) |"]
    rows.append("|---" * (6 + len(priors)) + "|")
    for c in test:
        m = cal.metrics[f"test {c}"]
        far = m["far_at"].get("far=0.01")
        far_text = "-"
        if far:
            ci = far["ci"]
            far_text = f"{100 * far['far']:.2f} %" + (f" ({100 * ci['low']:.2f}-{100 * ci['high']:.2f})" if ci else "")
        dcf = " | ".join(
            f"{m['act_dcf'][p]:.3f} / {m['min_dcf'][p]:.3f} = {m['act_dcf'][p] / m['min_dcf'][p]:.2f}" for p in priors
        )
        low, high = ratio_interval(cal, work, c, float(priors[0]))
        dcf = (
            dcf.replace(" | ", f" ({low:.2f}-{high:.2f}) | ", 1) if len(priors) > 1 else f"{dcf} ({low:.2f}-{high:.2f})"
        )
        cells = f"{c} | {m['n_trials']} | {100 * m['eer']:.2f} | {m['cllr']:.3f} | {m['min_cllr']:.3f}"
        rows.append(f"| {cells} | {dcf} | {far_text} |")
    fit_m = cal.metrics["fit"]
    rows.append(f"\nfitted on {fit_m['n_trials']} val trials ({fit_m['n_nontarget']} nontarget): {cal.describe()}")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, type=Path, help="egs/mini's data dir (val/ and test/ with trials)")
    ap.add_argument("--model", required=True, help="the trained model: exp dir or checkpoint")
    ap.add_argument("--work", required=True, type=Path, help="folder for the condition sets (reused)")
    ap.add_argument("--conditions", type=float, nargs="+", default=[1, 2, 4, 0], help="seconds; 0: whole files")
    ap.add_argument(
        "--degraded", nargs="*", default=[], help="speakerlab.dataio.waveform.degrade conditions of the test side"
    )
    ap.add_argument("--noise-bank", help="noise bank folder (speakerlab-noise-bank) of noise and reverb conditions")
    ap.add_argument("--seed", type=int, default=0, help="seed of the degradations (speakerlab-stress's default)")
    ap.add_argument("--cal-pairs", choices=["listed", "all"], default="listed", help="val trials: listed or all pairs")
    ap.add_argument("--fit-prior", type=float, help="speakerlab-calibrate's --fit-prior (default: the first prior)")
    ap.add_argument("--p-target", type=float, nargs="+", default=[0.01, 0.05])
    ap.add_argument("--enrol", type=int, default=3, help="files per enrolled speaker")
    args = ap.parse_args(argv)
    print("command: python bench/calibration.py " + " ".join(sys.argv[1:] if argv is None else argv))
    t0 = time.time()
    embedder = load_embedder(args.model, device="cpu")
    bank = NoiseBank(args.noise_bank) if args.noise_bank else None
    check_conditions(args.degraded, bank)
    durations = [f"{c:g}s" if c else "full" for c in args.conditions]
    if args.degraded and "full" not in durations:
        ap.error("--degraded conditions are scored against clean whole files: keep 0 in --conditions")
    clean_first = sorted(durations, key=lambda c: c != "full")
    for split in ("val", "test"):
        for c in [*clean_first, *args.degraded]:
            condition_set(embedder, args.data / split, c, args.work, f"{split}_{c}", bank, args.seed, False)
            if split == "val":
                condition_set(embedder, args.data / split, c, args.work, f"{split}_{c}", bank, args.seed, True)
            print(f"{split} {c}: embedded ({time.time() - t0:.0f} s)", flush=True)
    pairs = "trials_all" if args.cal_pairs == "all" else "trials"
    priors = [f"{p:g}" for p in args.p_target]
    test = [*durations, *args.degraded]
    cal = fit_and_measure(args, durations, test, args.work / "calibration.json", pairs)
    print("\n### Fitted on clean val (the durations pooled)\n\n" + table(cal, test, priors, args.work))
    if args.degraded:
        pooled = fit_and_measure(args, test, test, args.work / "calibration_pooled.json", pairs)
        print("\n### Fitted on val with the degraded conditions pooled\n\n" + table(pooled, test, priors, args.work))
    print("\n" + open_set(embedder, args.data / "test", cal, args.enrol, args.work))
    print(f"({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
