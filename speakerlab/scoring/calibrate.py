"""`speakerlab-calibrate`: fit a model's score calibration on held-out trial lists, measure it, write it.

    speakerlab-calibrate --embeddings exp/mini/embeddings/val.npz --trials data/val/trials \
        --durations data/val data/test --eval-embeddings exp/mini/embeddings/test.npz \
        --eval-trials data/test/trials --p-target 0.01 0.05 --out exp/mini/calibration.json

The fit: QMF (speakerlab.scoring.calibration: logistic regression from the cosine, the two sides' log-durations when
`--durations` are given, and the raw embedding norms, to an LLR) on the `--trials` lists pooled (each scored on its
`--embeddings`, one file or one per list), prior-weighted at `--fit-prior` (default: the first `--p-target`, the
recipe's operating prior, where a deployment's decisions are made). Lists of several durations (whole utterances
and crops) pooled make the duration weights meaningful; a calibration fitted on 4-8 s trials and used on 1 s ones
extrapolates.

Reported per list, printed one line each and stored in the file's `metrics`: EER, Cllr and min-Cllr (bits),
actDCF and minDCF at each `--p-target` (c_miss = c_fa = 1). On the `--eval-trials` lists (held out: never part of
the fit; a list with the bytes of a `--trials` list is refused) also the FAR measured at the stored FAR thresholds,
with its speaker-bootstrap interval (speakerlab.scoring.interval.far_interval).

The file (speakerlab.scoring.calibration_file): the QMF, the model digest every embeddings file must share (the
`model_id` speakerlab-extract records; files of two models, or of none, are refused), the lists it was fitted on
(paths, sha256, counts), the metrics, and the operating points (thresholds at the EER and at FAR 1 % and 0.1 %, in
LLR and raw-cosine units, measured on the fitting lists), and the open-set "unknown" thresholds measured on the
fitting lists' impostor maxima over galleries of their own speakers (speakerlab.scoring.open_set). Bad input: one
`error:` line naming the file, exit 2.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from speakerlab.commands import CommandParser, run_command
from speakerlab.dataio.tables.embeddings import embeddings_model_id, read_embeddings
from speakerlab.dataio.tables.lists import ListError
from speakerlab.dataio.tables.trials import TrialList
from speakerlab.outputs import OutputError, check_not_input, same_bytes
from speakerlab.scoring.calibration import (
    DURATION_FILES,
    FEATURES,
    FEATURES_NO_DUR,
    QMF,
    act_dcf,
    cllr,
    min_cllr,
    read_durations,
)
from speakerlab.scoring.calibration_file import (
    Calibration,
    CalibrationError,
    far_curve,
    file_digest,
    operating_points,
    write_calibration,
)
from speakerlab.scoring.interval import CI_LEVEL, CI_REPLICATES, far_interval, interval_problem, trial_speakers
from speakerlab.scoring.metrics import verification_metrics
from speakerlab.scoring.open_set import open_set_curve
from speakerlab.scoring.scorer import Scorer


class Scored:
    """Trial lists scored on their embeddings: raw cosines, QMF features, labels, and the list objects."""

    def __init__(self):
        self.raw: List[np.ndarray] = []
        self.features: List[np.ndarray] = []
        self.target: List[np.ndarray] = []
        self.lists: List[Tuple[Scorer, TrialList]] = []
        self.model_ids: Dict[str, str] = {}


def score_lists(
    trials: Sequence[str], embeddings: Sequence[str], durations: Optional[Dict[str, float]], dur_source: str
) -> Scored:
    """Each trial list scored by cosine on its embeddings (one file for all, or one per list)."""
    if len(embeddings) not in (1, len(trials)):
        raise ListError(f"give one embeddings file, or one per trial list ({len(trials)}), got {len(embeddings)}")
    out = Scored()
    scorers: Dict[str, Scorer] = {}
    for k, path in enumerate(trials):
        emb_path = embeddings[k if len(embeddings) > 1 else 0]
        if emb_path not in scorers:
            ids, emb = read_embeddings(emb_path)
            scorers[emb_path] = Scorer(ids, emb, source=emb_path)
            if durations is not None:
                scorers[emb_path].set_durations(durations, dur_source)
            out.model_ids[emb_path] = embeddings_model_id(emb_path)
        scorer = scorers[emb_path]
        tl = scorer.trial_list(path)
        raw = scorer.raw_scores(tl)
        out.raw.append(raw)
        out.features.append(scorer.features(tl, raw))
        out.target.append(tl.target)
        out.lists.append((scorer, tl))
    return out


def one_model(model_ids: Dict[str, str]) -> str:
    """The one model digest all embeddings files record; a ListError names the file without one, or of another."""
    missing = [p for p, m in model_ids.items() if not m]
    if missing:
        raise ListError(
            f"{missing[0]}: embeddings without a model digest (model_id): make them with speakerlab-extract or "
            "speakerlab-embed from a speakerlab checkpoint, so the calibration can name its model"
        )
    first = next(iter(model_ids))
    other = next((p for p, m in model_ids.items() if m != model_ids[first]), None)
    if other is not None:
        raise ListError(f"{other}: embeddings of model {model_ids[other][:12]}, {first}: of {model_ids[first][:12]}")
    return model_ids[first]


def list_metrics(llr: np.ndarray, target: np.ndarray, priors: Sequence[float]) -> Dict:
    """EER, Cllr, min-Cllr (of the same LLRs: what a monotone recalibration of them could reach), actDCF and minDCF
    (at each prior) of one list's LLRs `(n,)`."""
    m = verification_metrics(llr, target, priors)
    return {
        "n_trials": int(len(target)),
        "n_target": int(target.sum()),
        "n_nontarget": int((~target).sum()),
        "eer": m["eer"],
        "cllr": cllr(llr, target),
        "min_cllr": min_cllr(llr, target),
        "act_dcf": {f"{p:g}": act_dcf(llr, target, p) for p in priors},
        "min_dcf": {f"{p:g}": v for p, v in m["min_dcf"].items()},
    }


def line(name: str, m: Dict) -> str:
    costs = " ".join(f"actDCF({p}) {m['act_dcf'][p]:.3f} minDCF({p}) {m['min_dcf'][p]:.3f}" for p in m["act_dcf"])
    text = (
        f"{name}: {m['n_trials']} trials, EER {100 * m['eer']:.2f} %, Cllr {m['cllr']:.3f} "
        f"minCllr {m['min_cllr']:.3f}, {costs}"
    )
    for point, got in m.get("far_at", {}).items():
        ci = got["ci"]
        interval = f" [{100 * ci['low']:.2f}, {100 * ci['high']:.2f}]" if ci else ""
        text += f"; FAR at the {point} threshold {100 * got['far']:.2f} %{interval}"
    return text


def held_out(args) -> None:
    """A ListError naming it when an --eval-trials list is one of the --trials lists fitted on (the same bytes, on
    whatever embeddings): its FAR and costs would be reported as held-out while measured on the fit's own trials."""
    fitted = [t for t in args.trials if Path(t).is_file()]
    for t in args.eval_trials or []:
        same = next((f for f in fitted if Path(t).is_file() and same_bytes(t, f)), None)
        if same is not None:
            raise ListError(f"{t}: the trials of --trials {same}, fitted on: not held out; measure on another list")


def run(args) -> Calibration:
    """The command without argument parsing: fit, measure, write -> the Calibration."""
    dirs = [Path(d) for d in args.durations or []]
    dur_files = [f for d in dirs for f in ([d / n for n in DURATION_FILES] if d.is_dir() else [d])]
    inputs = [*args.trials, *args.embeddings, *(args.eval_trials or []), *(args.eval_embeddings or []), *dur_files]
    check_not_input([args.out], inputs)
    durations = read_durations(args.durations, args.sample_rate) if args.durations else None
    dur_source = " ".join(args.durations or [])
    held_out(args)
    fit = score_lists(args.trials, args.embeddings, durations, dur_source)
    held = score_lists(args.eval_trials, args.eval_embeddings, durations, dur_source) if args.eval_trials else None
    model_id = one_model({**fit.model_ids, **(held.model_ids if held else {})})
    names = FEATURES if durations is not None else FEATURES_NO_DUR
    target = np.concatenate(fit.target)
    prior = args.fit_prior if args.fit_prior is not None else args.p_target[0]
    qmf = QMF(prior=prior).fit(np.concatenate(fit.features), target, names)
    n_speakers = sum(trial_speakers(tl, s.index).count for s, tl in fit.lists)
    fitted_on = {
        "trials": [str(t) for t in args.trials],
        "trials_sha256": [file_digest(t) for t in args.trials],
        "embeddings": list(dict.fromkeys(map(str, args.embeddings))),
        "durations": dur_source or None,
        "n_trials": int(len(target)),
        "n_target": int(target.sum()),
        "n_nontarget": int((~target).sum()),
        "n_speakers": int(n_speakers),
    }
    cal = Calibration.from_qmf(qmf, model_id, str(fit.lists[0][0].source), fitted_on, args.p_target)
    llr = qmf.llr(np.concatenate(fit.features))
    raw = np.concatenate(fit.raw)
    cal.operating_points = operating_points(llr, raw, target)
    cal.far_curve = far_curve(llr, target)
    cal.open_set = open_set_curve(fit.lists, qmf)
    cal.metrics["fit"] = list_metrics(llr, target, args.p_target)
    print(line("fit (pooled: " + " ".join(map(str, args.trials)) + ")", cal.metrics["fit"]))
    for k, (scorer, tl) in enumerate(held.lists if held else []):
        name = args.eval_names[k] if args.eval_names else str(tl.path)
        held_llr = qmf.llr(held.features[k])
        m = list_metrics(held_llr, tl.target, args.p_target)
        speakers = trial_speakers(tl, scorer.index)
        m["far_at"] = {}
        for point, op in cal.operating_points.items():
            if point.startswith("far=") and op["llr"] is not None:
                accept = held_llr >= op["llr"]
                far = float(accept[~tl.target].mean())
                ci = far_interval(accept, tl.target, speakers, replicates=args.ci_replicates)
                m["far_at"][point] = {"far": far, "ci": ci, "n_speakers": speakers.count}
        cal.metrics[name] = m
        print(line(name, m))
    write_calibration(args.out, cal)
    print(f"calibration ({cal.describe()}) -> {args.out}", file=sys.stderr)
    return cal


def _parser() -> CommandParser:
    ap = CommandParser(prog="speakerlab-calibrate", description=__doc__.split("\n")[0])
    ap.add_argument("--trials", required=True, nargs="+", help="held-out trial lists to fit on (pooled)")
    ap.add_argument("--embeddings", required=True, nargs="+", help="their embeddings .npz: one, or one per list")
    ap.add_argument("--eval-trials", nargs="+", help="held-out lists to measure the calibration on (not fitted)")
    ap.add_argument("--eval-embeddings", nargs="+", help="their embeddings: one, or one per list")
    ap.add_argument("--eval-names", nargs="+", help="names of the --eval-trials lists in the report")
    ap.add_argument("--durations", nargs="+", help="utt2dur / utt2num_samples files or data dirs of every list")
    ap.add_argument("--sample-rate", type=int, default=16000, help="of utt2num_samples")
    ap.add_argument("--p-target", type=float, nargs="+", default=[0.01, 0.05], help="priors of actDCF and minDCF")
    ap.add_argument("--fit-prior", type=float, help="prior the QMF is fitted at (default: the first --p-target)")
    ap.add_argument("--ci-replicates", type=int, default=CI_REPLICATES, help="bootstrap replicates of FAR intervals")
    ap.add_argument("--out", required=True, help="the calibration file (JSON), e.g. <exp>/calibration.json")
    return ap


def main(argv=None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if bool(args.eval_trials) != bool(args.eval_embeddings):
        ap.error("--eval-trials and --eval-embeddings go together")
    if args.eval_names and len(args.eval_names) != len(args.eval_trials or []):
        ap.error("--eval-names: one name per --eval-trials list")
    names = args.eval_names or args.eval_trials or []
    again = next((n for k, n in enumerate(names) if n in names[:k] or n == "fit"), None)
    if again is not None:  # each list's metrics are stored under its name: a repeated one would replace another's
        what = "--eval-names" if args.eval_names else "--eval-trials (give --eval-names)"
        ap.error(f"{what}: '{again}' names two lists' metrics ('fit' is the fitting lists'): give each its own name")
    if any(not 0 < p < 1 for p in args.p_target + ([args.fit_prior] if args.fit_prior is not None else [])):
        ap.error("--p-target and --fit-prior values must lie in (0, 1)")
    problem = interval_problem(CI_LEVEL, args.ci_replicates)
    if problem:
        ap.error(problem)
    return run_command(lambda: run(args), (ListError, CalibrationError, OutputError, ValueError))


if __name__ == "__main__":
    sys.exit(main())
