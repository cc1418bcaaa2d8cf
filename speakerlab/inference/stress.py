"""The stress table: a model's EER and minDCF on a trial list under the conditions users meet.

    speakerlab-stress --checkpoint exp/campplus --data data/test --noise-bank data/musan_rirs/bank \
        --out exp/campplus/stress/test.md --json exp/campplus/stress/test.json
    speakerlab-stress --onnx model.onnx --data data/test --conditions clean trunc1 gsm tel+noise5 --both-sides

Conditions are those of `speakerlab.dataio.waveform.degrade` (truncation, telephone band, G.711, GSM, Opus, MP3,
noise at an SNR, reverberation, combinations); the default is its DEFAULT_CONDITIONS, less those needing
a noise bank when none is given (said on stderr). Each is applied to the test side of every trial
(enrolment kept clean, as a user's enrolment usually is), or to both sides with `--both-sides`.

Streamed, not cached: every condition reads its side's audio again and degrades it in memory, EMBED_CHUNK
utterances at a time (a degraded utterance is a function of (utterance, condition, seed), so nothing needs
keeping); the disk cost is nil and the memory one chunk of audio plus one embedding per utterance. The
clean embeddings are computed once (an utterance on both sides of the list once) and serve the clean side of every
condition. `--test-utts N` keeps the trials of a seeded draw of N test utterances: a condition's cost is that of
embedding its test side, so the draw bounds it (egs/mini's stage 9 default: see egs/mini/run.sh).

Rows: the condition, the side, the mean seconds of the degraded test audio, the trial and speaker counts,
the EER with its 95% speaker-bootstrap interval (speakerlab.scoring.interval), minDCF at p_target 0.01
and the EER's change against the clean row. The markdown table goes to stdout (and `--out`), the rows
as JSON to `--json` ('-': stdout). Bad input exits 2 with one line naming the file.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from speakerlab.commands import CommandParser
from speakerlab.dataio.tables.embeddings import embeddings_model_id, read_embeddings
from speakerlab.dataio.tables.lists import ListError, read_wav_scp
from speakerlab.dataio.tables.trials import IdIndex, TrialList, read_trial_list
from speakerlab.dataio.waveform.degrade import (
    DEFAULT_CONDITIONS,
    ConditionError,
    check_conditions,
    degrade,
    needs_bank,
    rng_for,
)
from speakerlab.dataio.waveform.noise_bank import NoiseBank
from speakerlab.inference.cli import EMBED_CHUNK, UsageError, bad_input, read_wave, source_embedder
from speakerlab.inference.common import add_source_args, check_finite, too_short
from speakerlab.outputs import check_file_output, check_not_input, write_text
from speakerlab.scoring.interval import CI_LEVEL, CI_REPLICATES, interval_problem, trial_speakers
from speakerlab.scoring.norm import unit_rows
from speakerlab.scoring.report import eer_text
from speakerlab.scoring.scorer import cosine_trial_scores, summarise

P_TARGET = 0.01


class StressSet:
    """A data dir's trials for the stress table: `tl` (speakerlab.dataio.tables.trials.TrialList) over the ids of
    its wav.scp, the `speakers` of every trial, and the rows each side uses (`enrol_rows`, `test_rows`).

    `test_utts`: keep a seeded draw of that many test-side utterances and the trials whose test side is among
    them (None or more than the list has: all). Each condition degrades and embeds the test side only, so its
    cost falls with the draw; the rows' trial counts and speaker-bootstrap intervals are those of the kept
    trials, so a smaller draw shows as a wider interval, not as a better number."""

    def __init__(
        self,
        data: Path,
        trials: Optional[Path] = None,
        utt2spk: Optional[Path] = None,
        test_utts: Optional[int] = None,
        seed: int = 0,
    ):
        self.scp = data / "wav.scp"
        if not self.scp.is_file():
            raise ListError(f"{self.scp}: file does not exist (--data must be a Kaldi data dir)")
        self.table = read_wav_scp(self.scp)
        self.ids = list(self.table)
        self.index = IdIndex(self.ids, str(self.scp))
        self.tl = read_trial_list(trials or data / "trials", self.index, lacking=f"not in {self.scp}")
        self.all_trials = len(self.tl)
        if test_utts is not None:
            self.tl = keep_test_side(self.tl, test_utts, seed)
        self.speakers = trial_speakers(self.tl, self.index, utt2spk)
        self.enrol_rows = np.unique(self.tl.enrol)
        self.test_rows = np.unique(self.tl.test)

    def where(self, row: int) -> str:
        utt = self.ids[row]
        return f"{self.scp}:{self.table[utt][0]}: {utt}: "


def keep_test_side(tl: TrialList, count: int, seed: int) -> TrialList:
    """The trials of `tl` whose test side is among a seeded draw (without replacement) of `count` of its distinct
    test utterances, in list order; `tl` itself when it has no more than `count`."""
    tests = np.unique(tl.test)
    if count >= len(tests):
        return tl
    drawn = np.random.default_rng([int(seed), count]).choice(tests, size=count, replace=False)
    keep = np.isin(tl.test, drawn)
    if not tl.target[keep].any() or tl.target[keep].all():
        raise ListError(f"{tl.path}: a draw of {count} test utterances keeps no target or no non-target trial")
    return replace(tl, enrol=tl.enrol[keep], test=tl.test[keep], target=tl.target[keep], line=tl.line[keep])


def embed_rows(embedder, data: StressSet, rows: np.ndarray, condition: str, seed: int, bank, batch: int):
    """Embeddings `(M, D)` of the utterances `rows` (of data.ids) under `condition`, and their seconds `(M,)`.

    Read, degraded and embedded EMBED_CHUNK utterances at a time; a degraded wave too short for the model
    is refused by `read_wave`'s rule, naming the wav.scp line and the condition."""
    parts, seconds = [], np.zeros(len(rows))
    rate = embedder.sample_rate
    for lo in range(0, len(rows), EMBED_CHUNK):
        waves = []
        for k, r in enumerate(rows[lo : lo + EMBED_CHUNK], lo):
            utt, where = data.ids[r], data.where(r)
            wave = read_wave(embedder, data.table[utt][1], where)
            if condition != "clean":
                wave = degrade(wave, rate, condition, rng_for(utt, condition, seed), bank)
            short = too_short(len(wave), embedder)
            if short:
                raise ConditionError(f"{where}under {condition}: {short}")
            seconds[k] = len(wave) / rate
            waves.append(wave)
        parts.append(embedder.embed_waves(waves, batch))
    emb = np.concatenate(parts)
    check_finite([f"{data.where(r)}under {condition}" for r in rows], emb)
    return emb, seconds


def side_matrix(data: StressSet, rows: np.ndarray, emb: np.ndarray) -> np.ndarray:
    """Unit embeddings `(len(data.ids), D)` with `emb` (M, D) at `rows`, zeros elsewhere (never scored)."""
    full = np.zeros((len(data.ids), emb.shape[1]), np.float32)
    full[rows] = unit_rows(emb)
    return full


def condition_row(name: str, data: StressSet, enrol: np.ndarray, test: np.ndarray, args, seconds: float) -> Dict:
    """One row: `enrol`, `test` (len(ids), D) unit matrices -> summarise()'s metrics of the trial list, with the
    condition, side and mean test seconds."""
    tl = data.tl
    scores = cosine_trial_scores(np.concatenate([enrol, test]), tl.enrol, tl.test + len(data.ids))
    row = summarise(name, tl, scores, (P_TARGET,), False, False, data.speakers, args.ci_level, args.ci_replicates)
    del row["operating_points"]  # thresholds do not travel across conditions: the table does not offer them
    row.update(condition=name, side="both" if args.both_sides and name != "clean" else "test", test_seconds=seconds)
    return row


def stored_clean(path: str, embedder, data: StressSet, rows: np.ndarray) -> np.ndarray:
    """The clean embeddings `(len(rows), D)` of `rows` from an embeddings .npz of this same model (its `model_id`,
    a checkpoint's content digest, must be the embedder's: a file of another model is refused, naming it)."""
    ids, emb = read_embeddings(path)  # first: a missing or unreadable file is said as such
    made_by, model_id = embeddings_model_id(path), getattr(embedder, "model_id", "")
    if not made_by or made_by != model_id:
        said = f"model {made_by}" if made_by else "no model_id"
        raise ListError(f"{path}: made by {said}, not this model ({model_id or 'no model_id'}): re-run its extraction")
    at = {u: i for i, u in enumerate(ids)}
    missing = [data.ids[r] for r in rows if data.ids[r] not in at]
    if missing:
        raise ListError(f"{path}: no embedding of '{missing[0]}' of {data.scp} ({len(missing)} utterances)")
    return emb[[at[data.ids[r]] for r in rows]]


def clean_side(embedder, data: StressSet, args) -> tuple:
    """The clean embeddings of every utterance of the list as a unit matrix `(len(ids), D)` (an utterance on both
    sides embedded once; read from `args.clean_embeddings` when given), and the mean seconds of the test side."""
    both = np.union1d(data.enrol_rows, data.test_rows)
    if args.clean_embeddings:
        emb = stored_clean(args.clean_embeddings, embedder, data, both)
        samples = [len(read_wave(embedder, data.table[data.ids[r]][1], data.where(r))) for r in data.test_rows]
        return side_matrix(data, both, emb), float(np.mean(samples)) / embedder.sample_rate
    emb, secs = embed_rows(embedder, data, both, "clean", args.seed, None, args.batch_size)
    return side_matrix(data, both, emb), float(secs[np.isin(both, data.test_rows)].mean())


def stress_rows(embedder, data: StressSet, conditions: Sequence[str], args, bank, log) -> List[Dict]:
    """The table's rows, one per condition, in order; clean embeddings computed (or read) once."""
    clean_enrol, clean_s = clean_side(embedder, data, args)
    clean_test = clean_enrol
    rows = []
    for name in conditions:
        t0 = time.time()
        enrol, test, seconds = clean_enrol, clean_test, clean_s
        if name != "clean":
            t, secs = embed_rows(embedder, data, data.test_rows, name, args.seed, bank, args.batch_size)
            test, seconds = side_matrix(data, data.test_rows, t), float(secs.mean())
            if args.both_sides:
                e, _ = embed_rows(embedder, data, data.enrol_rows, name, args.seed, bank, args.batch_size)
                enrol = side_matrix(data, data.enrol_rows, e)
        rows.append(condition_row(name, data, enrol, test, args, seconds))
        log(f"speakerlab-stress: {name}: EER {eer_text(rows[-1])} ({time.time() - t0:.1f}s)")
    clean = next((r["eer"] for r in rows if r["condition"] == "clean"), None)
    for r in rows:
        r["eer_change"] = (r["eer"] / clean - 1.0) if clean else None
    return rows


def markdown(rows: Sequence[Dict]) -> str:
    """The stress table: one row per condition."""
    level = next((r["eer_ci"]["level"] for r in rows if r.get("eer_ci")), CI_LEVEL)
    head = ["condition", "side", "test s", "trials", "target", "speakers", "EER (%)", f"{level * 100:g}% CI (%)"]
    head += [f"minDCF({P_TARGET:g})", "EER vs clean"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * len(head)) + "|"]
    for r in rows:
        ci = r.get("eer_ci")
        change = r.get("eer_change")
        lines.append(
            "| "
            + " | ".join(
                [
                    r["condition"],
                    r["side"],
                    f"{r['test_seconds']:.2f}",
                    str(r["n_trials"]),
                    str(r["n_target"]),
                    str(r.get("n_speakers", "-")),
                    f"{r['eer'] * 100:.2f}",
                    f"{ci['low'] * 100:.2f}-{ci['high'] * 100:.2f}" if ci else "-",
                    f"{r['min_dcf'][f'{P_TARGET:g}']:.4f}",
                    f"{change * 100:+.0f}%" if change is not None and r["condition"] != "clean" else "-",
                ]
            )
            + " |"
        )
    mean = [r["eer"] for r in rows if r["condition"] != "clean"]
    footer = f"\nMean EER over the {len(mean)} degraded conditions: {np.mean(mean) * 100:.2f}%\n" if mean else ""
    return "\n".join(lines) + "\n" + footer


def parser() -> argparse.ArgumentParser:
    ap = CommandParser(prog="speakerlab-stress", description=__doc__.split("\n")[0])
    add_source_args(ap, onnx=True)
    ap.add_argument("--data", required=True, help="Kaldi data dir: wav.scp, trials (and utt2spk)")
    ap.add_argument("--trials", help="trial list (default: <data>/trials)")
    ap.add_argument("--utt2spk", help="speakers of the trials' utterances (default: the utt2spk beside the list)")
    ap.add_argument(
        "--conditions", nargs="+", help="condition names (speakerlab.dataio.waveform.degrade); default: all"
    )
    ap.add_argument("--noise-bank", help="noise bank folder (speakerlab-noise-bank) for noise, music, babble, reverb")
    ap.add_argument(
        "--test-utts",
        type=int,
        help="a seeded draw of this many test-side utterances and their trials (default: all; the cost of a "
        "condition is that of embedding its test side)",
    )
    ap.add_argument(
        "--clean-embeddings",
        help="the clean side's embeddings from this model's extraction (.npz of speakerlab-extract, the same "
        "model_id), instead of embedding it again",
    )
    ap.add_argument("--both-sides", action="store_true", help="degrade enrolment too (default: the test side only)")
    ap.add_argument("--seed", type=int, default=0, help="seed of every draw (crop start, noise, RIR)")
    ap.add_argument("--batch-size", type=int, default=32, help="utterances per model call (equal frame counts)")
    ap.add_argument("--ci-level", type=float, default=CI_LEVEL, help="confidence level of the EER interval")
    ap.add_argument("--ci-replicates", type=int, default=CI_REPLICATES, help="bootstrap replicates (0: no interval)")
    ap.add_argument("--out", help="also write the markdown table here")
    ap.add_argument("--json", help="write the rows as JSON here ('-': stdout, then the table goes to stderr)")
    return ap


def pick_conditions(asked: Optional[Sequence[str]], bank, log) -> List[str]:
    """The asked conditions (checked: parse, bank audio, codec), or the defaults this setup can run."""
    if asked:
        names = list(dict.fromkeys(asked))
    else:
        names = [c for c in DEFAULT_CONDITIONS if bank is not None or not needs_bank(c)]
        if len(names) < len(DEFAULT_CONDITIONS):
            left = [c for c in DEFAULT_CONDITIONS if c not in names]
            log(f"speakerlab-stress: no --noise-bank: left out {' '.join(left)}")
    check_conditions(names, bank)
    return names


def drawn(data: StressSet) -> str:
    """What the test-side draw kept, for the log line ('' when it kept everything)."""
    if len(data.tl) == data.all_trials:
        return ""
    return f" (of {data.all_trials}: those of a seeded draw of {len(data.test_rows)} test utterances)"


def check_outputs(args) -> None:
    """--out and --json, before the table is computed: an OutputError when one cannot be written as a file, or is one
    of the command's inputs (the trial list, a file of the data dir, the model, the clean embeddings)."""
    outputs = [p for p in (args.out, args.json) if p]
    for path, allow_stdout in ((args.out, False), (args.json, True)):
        if path:
            check_file_output(path, allow_stdout=allow_stdout)
    data = Path(args.data)
    inputs = [args.trials, args.utt2spk, args.clean_embeddings, args.checkpoint, args.weights, args.redimnet2]
    check_not_input(outputs, [*inputs, args.onnx, *(sorted(data.iterdir()) if data.is_dir() else [])])


def run(argv: Optional[Sequence[str]] = None) -> int:
    """`speakerlab-stress` without the process exit: returns the exit code."""
    ap = parser()
    args = ap.parse_args(argv)
    problem = interval_problem(args.ci_level, args.ci_replicates)
    if problem:
        ap.error(problem)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr)

    try:
        check_outputs(args)
        bank = NoiseBank(args.noise_bank) if args.noise_bank else None
        conditions = pick_conditions(args.conditions, bank, log)
        if args.test_utts is not None and args.test_utts < 1:
            raise UsageError(f"--test-utts must be >= 1, got {args.test_utts}")
        trials = Path(args.trials) if args.trials else None
        data = StressSet(Path(args.data), trials, args.utt2spk, args.test_utts, args.seed)
        embedder = source_embedder(ap, args)
        if bank is not None and bank.sample_rate != embedder.sample_rate:  # its noise would play at another speed
            raise ConditionError(
                f"{bank.root}: a noise bank of {bank.sample_rate} Hz audio, this model's is {embedder.sample_rate} Hz: "
                f"build one at that rate (speakerlab-noise-bank --sample-rate {embedder.sample_rate})"
            )
        log(
            f"speakerlab-stress: {embedder.name}, {len(data.tl)} trials of {data.tl.path}{drawn(data)}, "
            f"{len(conditions)} condition(s) on the {'both' if args.both_sides else 'test'} side(s), "
            "audio streamed (nothing cached)"
        )
        rows = stress_rows(embedder, data, conditions, args, bank, log)
        table = markdown(rows)
        if args.out:
            write_text(args.out, table)
        if args.json:
            payload = {"model": embedder.name, "trials": str(data.tl.path), "seed": args.seed}
            payload.update(test_utts=len(data.test_rows), list_trials=data.all_trials, rows=rows)
            write_text(args.json, json.dumps(payload, indent=2) + "\n", allow_stdout=True)
    except bad_input() as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(table, end="", file=sys.stderr if args.json == "-" else sys.stdout)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Console script `speakerlab-stress`."""
    sys.exit(run(argv))
