"""Cosine scoring of trial lists at scale, with score normalisation, calibration, metrics and pictures.

    speakerlab-score --embeddings exp/mini/embeddings/test.npz --trials data/test/trials \
        --out exp/mini/scores/test
    speakerlab-score --embeddings test.npz --trials data/O/trials data/E/trials --out exp/scores \
        --cohort train.npz --cohort-utt2spk data/train/utt2spk --mean-sub --asnorm-top-n 300 \
        --qmf-train data/dev/trials --durations data/test/utt2num_samples

Steps per list: parse (`speakerlab.dataio.tables.trials`), cosine of unit embeddings (after subtracting the cohort mean
with `--mean-sub`), AS-norm (`--asnorm-top-n N`, `speakerlab.scoring.norm`), QMF calibration to LLRs
(`--qmf-train`, `speakerlab.scoring.calibration`), metrics (EER, minDCF at each `--p-target`, c_miss = c_fa = 1;
Cllr and actDCF when calibrated), the EER's confidence interval (`speakerlab.scoring.interval`: a bootstrap
over the list's speakers, `--ci-level`, `--ci-replicates`), outputs (`speakerlab.scoring.report`,
`speakerlab.scoring.plots`).

How many trials and speakers stand behind each EER is said with it: target and nontarget trials, and the
speakers, from `--utt2spk` (one file, or one per list), else the `utt2spk` beside the trial list when it names
every utterance, else the groups that target trials connect. Below `dataio.tables.trials.MIN_SPEAKERS` speakers or
`MIN_TARGET_TRIALS` target trials one `warning:` line on stderr (and `warning` in P.json) says that the EER
cannot tell models apart.

Output layout. `--out` is one prefix per trial list (the list is named after the prefix's last part), or,
for several lists (or a path ending in `/` or an existing directory), one directory where each list gets
the prefix `DIR/<name>` (`--names`, else the file name, else its parent directory's name when file names
repeat). Per prefix P:
    P.scores     `enrol test score target|nontarget`, one line per trial, in list order; the score is
                 the cosine, its AS-norm, or with --qmf-train the calibrated LLR (natural log)
    P.result     one line: counts (trials, target, nontarget, speakers), EER with its interval and threshold,
                 minDCF, the thresholds at false-alarm rates 1% and 0.1% with their miss rates (and Cllr,
                 actDCF), as printed
    P.json       the same numbers (`n_target`, `n_nontarget`, `n_speakers`, `speakers_from`, `eer_ci`:
                 level, low, high, method, replicates, trials_used; `operating_points`: threshold, p_miss,
                 p_fa of each) and the settings
    P.det.png    DET curve, 640 x 480 px
    P.hist.png   target / nontarget score histograms, 640 x 480 px
and one markdown table over all lists, printed and written to `--table` (default: DIR/results.md in
directory mode, else `<first prefix>.md`). Bad inputs exit with code 2 and a `file:line:` message.

From Python: `run(args)` is the command without its argument parsing; the engine (`evaluate`, `Scorer`, how
memory and time are bounded) is speakerlab.scoring.scorer. P.scores is written in blocks of 64 k lines by a
second thread while the metrics and pictures are computed; matplotlib is imported only for the pictures.
Measured figures: bench/RESULTS.md (bench/scoring.py runs this command end to end).
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from speakerlab.commands import CommandParser, run_command
from speakerlab.dataio.tables.embeddings import embeddings_model_id, read_embeddings
from speakerlab.dataio.tables.lists import ListError, read_utt2spk
from speakerlab.outputs import OutputError, check_folder_output, check_not_input, write_text
from speakerlab.scoring.calibration import FEATURES, FEATURES_NO_DUR, QMF, read_durations
from speakerlab.scoring.interval import CI_LEVEL, CI_REPLICATES, interval_problem, trial_speakers
from speakerlab.scoring.norm import Cohort
from speakerlab.scoring.scorer import Scorer, summarise


def _names(trials: Sequence[Path]) -> List[str]:
    """File names, or parent directory names when file names repeat, or whole paths."""
    for names in ([p.name for p in trials], [p.parent.name for p in trials]):
        if len(set(names)) == len(names) and all(names):
            return names
    return ["_".join(p.parts).strip("/_") for p in trials]


def output_prefixes(trials: Sequence[str], out: Sequence[str], names: Optional[Sequence[str]]):
    """-> (names, prefixes, table path, directory mode) following the layout of the module docstring."""
    paths = [Path(t) for t in trials]
    dir_mode = len(out) == 1 and (len(trials) > 1 or out[0].endswith("/") or Path(out[0]).is_dir())
    if not dir_mode and len(out) != len(trials):
        raise ValueError(f"--out: give one prefix per trial list ({len(trials)}) or one directory")
    if names is not None and len(names) != len(trials):
        raise ValueError(f"--names: give one name per trial list ({len(trials)})")
    if names is None:  # prefixes name their lists (exp/scores/test -> test); in a directory, the trial files do
        names = _names(paths) if dir_mode else [Path(o).name for o in out]
    names = list(names)
    if dir_mode:
        check_folder_output(out[0])
        if len(set(names)) != len(names):
            raise ValueError(f"--names: names must differ, got {names}")
        prefixes = [Path(out[0]) / n for n in names]
        return names, prefixes, Path(out[0]) / "results.md", True
    prefixes = [Path(o) for o in out]
    return names, prefixes, Path(f"{prefixes[0]}.md"), False


def _parser() -> argparse.ArgumentParser:
    ap = CommandParser(prog="speakerlab-score", description=__doc__.split("\n")[0])
    ap.add_argument("--embeddings", required=True, help=".npz with ids and embeddings (speakerlab.inference.extract)")
    ap.add_argument("--trials", required=True, nargs="+", help="one or more trial lists")
    ap.add_argument("--out", required=True, nargs="+", help="one prefix per list, or one directory")
    ap.add_argument("--names", nargs="+", help="list names (directory mode file names, table rows)")
    ap.add_argument("--table", help="markdown table file (default: DIR/results.md or <first prefix>.md)")
    ap.add_argument("--p-target", type=float, nargs="+", default=[0.01, 0.05], help="minDCF priors")
    ap.add_argument("--cohort", help="cohort (training-set) embeddings .npz for --mean-sub and AS-norm")
    ap.add_argument("--cohort-utt2spk", help="utt2spk of the cohort (speaker means for AS-norm)")
    ap.add_argument("--mean-sub", action="store_true", help="subtract the cohort mean embedding")
    ap.add_argument("--asnorm-top-n", type=int, default=0, help="AS-norm with the top N cohort speakers (0: off)")
    ap.add_argument("--qmf-train", help="held-out trial list to fit QMF calibration on")
    ap.add_argument("--qmf-embeddings", help="embeddings of --qmf-train (default: --embeddings)")
    ap.add_argument("--durations", nargs="+", help="utt2dur / utt2num_samples files or data dirs (QMF durations)")
    ap.add_argument("--sample-rate", type=int, default=16000, help="of utt2num_samples")
    ap.add_argument("--no-plots", action="store_true", help="skip the PNG files")
    ap.add_argument(
        "--utt2spk",
        nargs="+",
        help="speakers of the trials' utterances, for the counts and the EER interval: one file, or one per list "
        "(default: the utt2spk beside each list when it names all its utterances, else the groups target trials join)",
    )
    ap.add_argument("--ci-level", type=float, default=CI_LEVEL, help="confidence level of the EER interval")
    ap.add_argument("--ci-replicates", type=int, default=CI_REPLICATES, help="bootstrap replicates (0: no interval)")
    return ap


def _check_args(ap: argparse.ArgumentParser, args) -> None:
    if (args.mean_sub or args.asnorm_top_n > 0) and not args.cohort:
        ap.error("--mean-sub and --asnorm-top-n need --cohort")
    if args.asnorm_top_n > 0 and not args.cohort_utt2spk:
        ap.error("--asnorm-top-n needs --cohort-utt2spk")
    if args.asnorm_top_n < 0:
        ap.error("--asnorm-top-n must be >= 0")
    if (args.qmf_embeddings or args.durations) and not args.qmf_train:
        ap.error("--qmf-embeddings and --durations need --qmf-train")
    if any(not 0 < p < 1 for p in args.p_target):
        ap.error("--p-target values must lie in (0, 1)")
    if args.utt2spk and len(args.utt2spk) not in (1, len(args.trials)):
        ap.error(f"--utt2spk: give one file, or one per trial list ({len(args.trials)})")
    problem = interval_problem(args.ci_level, args.ci_replicates)
    if problem:
        ap.error(problem)


def _make_scorer(path, cohort: Optional[Cohort], durations: Optional[Dict[str, float]], dur_source: str):
    ids, emb = read_embeddings(path)
    scorer = Scorer(ids, emb, cohort, source=path)
    if durations is not None:
        scorer.set_durations(durations, dur_source)
    return scorer


def same_model(paths: Sequence[Optional[str]]) -> None:
    """A ListError naming two of the embeddings files `paths` that record different models (`model_id`): a cohort or a
    QMF fitted on another model's embeddings normalises or calibrates nothing. Files without a model_id pass."""
    ids = {p: embeddings_model_id(p) for p in paths if p is not None}
    known = [(p, m) for p, m in ids.items() if m]
    other = next(((p, m) for p, m in known if m != known[0][1]), None)
    if other is not None:
        raise ListError(
            f"{other[0]}: embeddings of model {other[1][:12]}, {known[0][0]}: of {known[0][1][:12]}; "
            "scores, cohort and calibration need embeddings of one model"
        )


def run(args) -> List[Dict]:
    """The command without argument parsing: score every list, write the outputs -> summaries."""
    from speakerlab.scoring.plots import plot_det, plot_histogram
    from speakerlab.scoring.report import eer_text, markdown_table, result_line, write_json, write_scores

    names, prefixes, table, _ = output_prefixes(args.trials, args.out, args.names)
    table = Path(args.table) if args.table else table
    outputs = [table, *(f"{p}.{ext}" for p in prefixes for ext in ("scores", "result", "json", "det.png", "hist.png"))]
    inputs = [args.embeddings, *args.trials, args.cohort, args.cohort_utt2spk, args.qmf_train, args.qmf_embeddings]
    check_not_input(outputs, [*inputs, *(args.durations or []), *(args.utt2spk or [])])
    folder = next((o for o in outputs if Path(o).is_dir()), None)
    if folder is not None:  # found here, not after the scoring when the table is written
        raise OutputError(f"{folder} is a folder, not a file: give the path of the file to write")
    same_model([args.embeddings, args.cohort, args.qmf_embeddings])
    cohort = None
    if args.cohort:
        c_ids, c_emb = read_embeddings(args.cohort)
        u2s = {u: s for u, (_, s) in read_utt2spk(args.cohort_utt2spk).items()} if args.cohort_utt2spk else None
        cohort = Cohort(c_ids, c_emb, u2s, args.mean_sub, args.asnorm_top_n, source=args.cohort)
    durations = read_durations(args.durations, args.sample_rate) if args.durations else None
    dur_source = " ".join(args.durations or [])
    scorer = _make_scorer(args.embeddings, cohort, durations, dur_source)
    lists = [scorer.trial_list(t) for t in args.trials]  # every list is checked before any output
    if args.qmf_train:
        same = not args.qmf_embeddings or Path(args.qmf_embeddings) == Path(args.embeddings)
        qmf_scorer = scorer if same else _make_scorer(args.qmf_embeddings, cohort, durations, dur_source)
        tl = qmf_scorer.trial_list(args.qmf_train)
        names_f = FEATURES if durations is not None else FEATURES_NO_DUR
        qmf = QMF().fit(qmf_scorer.features(tl, qmf_scorer.raw_scores(tl)), tl.target, names_f)
        scorer.qmf = qmf
    summaries = []
    for k, (name, prefix, tl) in enumerate(zip(names, prefixes, lists)):
        scores = scorer.scores(tl)
        u2s = args.utt2spk[k if len(args.utt2spk) > 1 else 0] if args.utt2spk else None
        speakers = trial_speakers(tl, scorer.index, u2s)
        files = {"scores": f"{prefix}.scores", "result": f"{prefix}.result", "json": f"{prefix}.json"}
        # The scores file (numpy formatting, GIL-free for the most part) is written by a second thread
        # while this one computes the metrics and draws the pictures.
        with ThreadPoolExecutor(1) as writer:
            written = writer.submit(write_scores, files["scores"], tl, scores)
            s = summarise(
                name,
                tl,
                scores,
                args.p_target,
                scorer.qmf is not None,
                keep_curves=not args.no_plots,
                speakers=speakers,
                ci_level=args.ci_level,
                ci_replicates=args.ci_replicates,
            )
            s["scoring"] = {
                "method": scorer.method(),
                "embeddings": str(args.embeddings),
                "model_id": embeddings_model_id(args.embeddings),  # speakerlab-verify finds its threshold by it
                "cohort": args.cohort,
                "mean_sub": bool(args.mean_sub),
                "asnorm_top_n": args.asnorm_top_n,
                "qmf_train": args.qmf_train,
                "qmf": scorer.qmf.describe() if scorer.qmf else None,
            }
            curves = s.pop("_curves", None)
            if curves is not None:
                title = f"{name}: {s['scoring']['method']}"
                dcf = {float(k): v for k, v in s["min_dcf"].items()}
                files["det"] = str(plot_det(curves[0], curves[1], f"{prefix}.det.png", title, s["eer"], dcf))
                files["hist"] = str(plot_histogram(scores, tl.target, f"{prefix}.hist.png", name))
            written.result()
        s["files"] = files
        line = result_line(s)
        write_text(files["result"], line + "\n")
        write_json(files["json"], s)
        print(line)
        if "warning" in s:
            print(f"warning: {s['warning']}: EER {eer_text(s)}", file=sys.stderr)
        summaries.append(s)
    text = markdown_table(summaries)
    write_text(table, text)
    print(text, end="")
    return summaries


def main(argv=None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    _check_args(ap, args)
    try:
        output_prefixes(args.trials, args.out, args.names)
    except ValueError as e:
        ap.error(str(e))  # exit code 2, as for any bad argument
    return run_command(lambda: run(args), (ListError, OutputError))


if __name__ == "__main__":
    sys.exit(main())
