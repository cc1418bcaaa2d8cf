"""Calibration and open-set identification of a trained egs/mini model, measured on held-out lists.

    python bench/calibration.py --data egs/mini/data --model egs/mini/exp/campplus --work /tmp/calib_bench

Calibration: the val and test utterances at each duration condition (the first 1, 2, 4 s of every file, and the
whole file), embedded by the model; every condition's val trials pooled fit one calibration (speakerlab-calibrate,
durations as side information), which is measured on each condition's test trials, never fitted on: Cllr, min-Cllr,
actDCF and minDCF at the priors, and the FAR measured at the stored 1 % threshold with its speaker-bootstrap
interval. Prints one markdown row per test condition (the rows of bench/RESULTS.md).

Open set: the test speakers sorted by name, every other one enrolled (its first `--enrol` whole files in a gallery),
the others never enrolled; every other test file is a probe (speakerlab.identification.identify: mean calibrated
LLR per speaker). Rank-1 rate: enrolled probes whose best speaker is theirs. FNIR at FPIR 1 %: the threshold on the
best score that names at most 1 % of the never-enrolled probes, and the enrolled probes it does not name correctly;
and the same at the threshold the calibration gives for FPIR 1 % (identify.fpir_threshold), with the FPIR it
reached.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from speakerlab.dataio.tables.embeddings import write_embeddings
from speakerlab.dataio.tables.lists import read_utt2spk, read_wav_scp
from speakerlab.identification.gallery import Gallery
from speakerlab.identification.identify import fpir_threshold, speaker_scores
from speakerlab.inference import load_embedder
from speakerlab.scoring.calibrate import main as calibrate
from speakerlab.scoring.calibration_file import read_calibration


def condition_set(embedder, data: Path, seconds: float, work: Path, name: str) -> Path:
    """The data dir `data` at one duration (`seconds` 0: whole files) -> work/name: utt2spk, utt2dur, trials (ids
    suffixed by the condition) and work/name.npz."""
    out = work / name
    if (work / f"{name}.npz").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    tag = f"-{seconds:g}s" if seconds else "-full"
    scp = read_wav_scp(data / "wav.scp")
    u2s = {u: s for u, (_, s) in read_utt2spk(data / "utt2spk").items()}
    ids = list(scp)
    waves = []
    for u in ids:
        wave = embedder.read(scp[u][1])
        waves.append(wave[: int(seconds * embedder.sample_rate)] if seconds else wave)
    emb = embedder.embed_waves(waves)
    (out / "utt2spk").write_text("".join(f"{u}{tag} {u2s[u]}\n" for u in ids))
    (out / "utt2dur").write_text("".join(f"{u}{tag} {len(w) / embedder.sample_rate:.4f}\n" for u, w in zip(ids, waves)))
    trials = [line.split() for line in (data / "trials").read_text().splitlines() if line.strip()]
    (out / "trials").write_text("".join(f"{e}{tag} {t}{tag} {lab}\n" for e, t, lab in trials))
    write_embeddings(work / f"{name}.npz", [f"{u}{tag}" for u in ids], emb, model_id=embedder.model_id)
    return out


def open_set(embedder, data: Path, cal, enrol: int, work: Path):
    """-> (rank-1 rate, FNIR at empirical FPIR 1 %, (FPIR, FNIR) at the calibration's FPIR-1 % threshold, counts)."""
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
    rank1 = float(right[known].mean())
    unknown_best = np.sort(best[~known])
    allowed = int(np.floor(0.01 * len(unknown_best)))  # unknown probes that may pass
    t = np.nextafter(unknown_best[len(unknown_best) - 1 - allowed], np.inf)
    fnir = float(1 - (right[known] & (best[known] >= t)).mean())
    t_cal = fpir_threshold(cal, 0.01, len(g.names()))
    fpir_cal = float((best[~known] >= t_cal).mean())
    fnir_cal = float(1 - (right[known] & (best[known] >= t_cal)).mean())
    counts = (len(g.names()), int(known.sum()), len(speakers) - len(g.names()), int((~known).sum()))
    return rank1, fnir, (fpir_cal, fnir_cal), counts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, type=Path, help="egs/mini's data dir (val/ and test/ with trials)")
    ap.add_argument("--model", required=True, help="the trained model: exp dir or checkpoint")
    ap.add_argument("--work", required=True, type=Path, help="folder for the condition sets (reused)")
    ap.add_argument("--conditions", type=float, nargs="+", default=[1, 2, 4, 0], help="seconds; 0: whole files")
    ap.add_argument("--p-target", type=float, nargs="+", default=[0.01, 0.05])
    ap.add_argument("--enrol", type=int, default=3, help="files per enrolled speaker")
    args = ap.parse_args(argv)
    print("command: python bench/calibration.py " + " ".join(sys.argv[1:] if argv is None else argv))
    t0 = time.time()
    embedder = load_embedder(args.model, device="cpu")
    names = {c: f"{c:g}s" if c else "full" for c in args.conditions}
    for c in args.conditions:
        for split in ("val", "test"):
            condition_set(embedder, args.data / split, c, args.work, f"{split}_{names[c]}")
    cal_path = args.work / "calibration.json"
    fit = [str(args.work / f"val_{names[c]}" / "trials") for c in args.conditions]
    fit_emb = [str(args.work / f"val_{names[c]}.npz") for c in args.conditions]
    test = [str(args.work / f"test_{names[c]}" / "trials") for c in args.conditions]
    test_emb = [str(args.work / f"test_{names[c]}.npz") for c in args.conditions]
    durs = [str(args.work / f"{s}_{names[c]}") for c in args.conditions for s in ("val", "test")]
    cmd = ["--trials", *fit, "--embeddings", *fit_emb, "--eval-trials", *test, "--eval-embeddings", *test_emb]
    cmd += ["--eval-names", *[f"test {names[c]}" for c in args.conditions], "--durations", *durs]
    assert calibrate([*cmd, "--p-target", *map(str, args.p_target), "--out", str(cal_path)]) == 0
    cal = read_calibration(cal_path)
    priors = [f"{p:g}" for p in args.p_target]
    costs = " | ".join(f"actDCF / minDCF ({p})" for p in priors)
    print(f"\n| test condition | trials | EER % | Cllr | min-Cllr | {costs} | FAR at the 1 % threshold (95 % CI) |")
    print("|---" * (6 + len(priors)) + "|")
    for c in args.conditions:
        m = cal.metrics[f"test {names[c]}"]
        far = m["far_at"].get("far=0.01")
        far_text = "-"
        if far:
            far_text = f"{100 * far['far']:.2f} % ({100 * far['ci']['low']:.2f}-{100 * far['ci']['high']:.2f})"
        dcf = " | ".join(
            f"{m['act_dcf'][p]:.3f} / {m['min_dcf'][p]:.3f} = {m['act_dcf'][p] / m['min_dcf'][p]:.2f}" for p in priors
        )
        print(
            f"| {names[c]} | {m['n_trials']} | {100 * m['eer']:.2f} | {m['cllr']:.3f} | {m['min_cllr']:.3f} | {dcf} "
            f"| {far_text} |"
        )
    fit_m = cal.metrics["fit"]
    print(f"\nfitted on {fit_m['n_trials']} val trials ({fit_m['n_nontarget']} nontarget) of the pooled conditions")
    got = open_set(embedder, args.data / "test", cal, args.enrol, args.work)
    rank1, fnir, (fpir_cal, fnir_cal), (n_enr, n_kp, n_unk, n_up) = got
    print(
        f"open set: {n_enr} enrolled speakers ({args.enrol} whole files each, {n_kp} probes), {n_unk} never enrolled "
        f"({n_up} probes): rank-1 {100 * rank1:.1f} %, FNIR at FPIR 1 % {100 * fnir:.1f} %; at the calibration's "
        f"FPIR-1 % threshold: FPIR {100 * fpir_cal:.1f} %, FNIR {100 * fnir_cal:.1f} %"
    )
    print(f"({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
