"""The console scripts: `speakerlab-verify` (one trial) and `speakerlab-embed` (a wav.scp of files).

    speakerlab-verify a.wav b.wav --checkpoint exp/campplus
    speakerlab-verify a.wav b.wav --3dspeaker campplus --weights campplus_cn_en_common.pt --threshold 0.35
    speakerlab-verify a.wav b.wav --checkpoint exp/campplus \
        --calibration data/dev/trials --calibration-embeddings exp/campplus/embeddings/dev.npz
    speakerlab-embed data/test/wav.scp exp/emb/test.npz --checkpoint exp/campplus
    speakerlab-embed data/test/wav.scp exp/emb/test.ark --3dspeaker campplus --weights w.pt   # + .scp, .npz
    speakerlab-embed data/test/wav.scp exp/emb/test.npz --redimnet2 b6-vox2-lm.pt     # a ReDimNet2 release
    speakerlab-embed data/test/wav.scp exp/emb/test.npz --onnx campplus.onnx   # torch-free (pip install ./runtime)

Both load the model through `speakerlab.inference.embedder.load_embedder` (our checkpoint file or exp dir, a
3D-Speaker state dict with its published features, or a ReDimNet2 release with its own log-mel front-end) and
read audio with `speakerlab.dataio.waveform.resample.read_for_model`:
any sample rate (resampled in torch to the model's),
multi-channel files as their first channel (with a warning on stderr naming the file). `speakerlab-embed --onnx`
runs a waveform ONNX file (speakerlab-export --waveform) through speakerlab.inference.deploy.runtime instead: no torch,
resampling by speakerlab.dataio.waveform.resample (numpy, the same filter);
this module imports torch only for the other sources.

`speakerlab-verify` decides with the model's calibration when it has one (speakerlab.inference.verify: `--calibration-
file`, else the one an ONNX file carries, else `<exp>/calibration.json` of `--checkpoint`; another model's is
refused), at the false-alarm rate `--far` (default 1 %):
    score 0.734512                          the cosine of the two embeddings
    llr 4.2130 (calibration <file>: <the lists it was fitted on, the model digest>)
    probability 0.9854 (same speaker, at prior 0.5)
    threshold llr 2.1080 at FAR 1 % (measured on the calibration lists)
    same speaker                            or: different speakers (same iff llr >= threshold)
Without a calibration, or with `--threshold` / `--calibration`, it prints three lines (and refuses `--far` / `--prior`,
which only a calibrated decision uses):
    score 0.734512
    threshold 0.412300 (<where it came from>)
    same speaker                            (same iff score >= threshold)
The cosine threshold is, first found of:
  1. `--threshold`;
  2. the EER threshold of `--calibration` (a trial list, `enrol test target|nontarget`) scored by cosine on
     `--calibration-embeddings` (an .npz of the same model, e.g. from `speakerlab-embed`): among the list's
     distinct scores t, deciding "same" iff score >= t, the t where |P_miss(t) - P_fa(t)| is smallest (the
     lower t on a tie), i.e. the operating point where the miss and false-alarm rates of that list cross;
  3. for `--checkpoint` (an exp dir or a checkpoint in one), the EER threshold the scoring stage found for
     this very checkpoint: a `<exp>/scores/**/*.json` of `speakerlab-score` (plain cosine) whose embeddings it
     made (the checkpoint's content digest, which extraction and scoring record as `model_id`); for `--onnx`, the
     one the file carries (`speakerlab.threshold`: speakerlab-export took it there from the exp dir's scoring);
  4. DEFAULT_THRESHOLD: a placeholder, not tuned for any model, and the threshold line says so.

`speakerlab-embed` reads `<id> <path>` lines and writes OUT: `.npz` with `ids` (wav.scp order) and
`embeddings (N, D)` float32 (`speakerlab.dataio.tables.embeddings`, as extraction writes); an OUT ending in `.ark`, or
`--kaldi`, also writes a Kaldi float-vector ark and its scp (kaldiio) next to the .npz. Nothing is written when a
file fails or an embedding is not finite.

Exit codes: 0 done; 2 bad input (a message on stderr naming the file, or the wav.scp line).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from speakerlab.commands import CommandParser, require_torch
from speakerlab.dataio.audio import AudioError
from speakerlab.dataio.tables.embeddings import kaldi_paths, read_embeddings, write_embeddings
from speakerlab.dataio.tables.lists import ListError, read_wav_scp
from speakerlab.devices import use_threads
from speakerlab.inference.common import NonFiniteEmbedding, add_source_args, check_finite, read_wave, warn_stderr
from speakerlab.inference.verify import Decision, decide, find_calibration, scored_threshold
from speakerlab.outputs import check_not_input
from speakerlab.scoring.calibration_file import CalibrationError
from speakerlab.scoring.metrics import eer_point, error_rates

# torch is imported by the functions that load a torch model (speakerlab.inference.embedder), not here:
# `speakerlab-embed --onnx` runs in the torch-free install (runtime/pyproject.toml).
if TYPE_CHECKING:
    from speakerlab.inference.deploy.runtime import OnnxEmbedder
    from speakerlab.inference.embedder import Embedder

DEFAULT_THRESHOLD = 0.5
FAR, PRIOR = 0.01, 0.5  # speakerlab-verify's calibrated decision when --far / --prior are not given
EMBED_CHUNK = 256  # files decoded at a time by speakerlab-embed: bounds memory on long lists
# ImportError: a model on a self-supervised encoder without the [ssl] extra (the message names it). A checkpoint
# that cannot be read is a SourceError (a ValueError) by the time it leaves speakerlab.sources.
BAD_INPUT = (ListError, AudioError, NonFiniteEmbedding, CalibrationError, ValueError, OSError, ImportError)


def bad_input() -> tuple:
    """BAD_INPUT, and speakerlab.checkpoint's CheckpointError once a torch path has loaded that module (importing
    it here would import torch on the ONNX path)."""
    checkpoint = sys.modules.get("speakerlab.checkpoint")
    return BAD_INPUT + ((checkpoint.CheckpointError,) if checkpoint else ())


class UsageError(ValueError):
    """An argument combination or value the parser cannot check; exit 2 with the message."""


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine of two `(D,)` vectors (float64)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-12))


def eer_threshold(scores: np.ndarray, labels: np.ndarray) -> Tuple[float, float, float]:
    """`scores (N,)`, `labels (N,)` bool -> (t, P_miss(t), P_fa(t)): among the distinct scores, the t
    (decide target iff score >= t) where |P_miss - P_fa| is smallest, the lower t on a tie."""
    point = eer_point(*error_rates(scores, labels))
    return point["threshold"], point["p_miss"], point["p_fa"]


def calibration_threshold(trials: str, embeddings: str, dim: Optional[int] = None) -> Tuple[float, str]:
    """The EER threshold of a trial list scored by cosine on an embeddings .npz -> (t, description).

    `dim`: the model's embedding size, checked against the file's (embeddings of another model would
    give a meaningless threshold)."""
    from speakerlab.scoring.scorer import evaluate  # the scoring stack only when calibrating

    ids, emb = read_embeddings(embeddings)
    if dim is not None and emb.shape[1] != dim:
        raise ListError(
            f"{embeddings}: embeddings of dimension {emb.shape[1]}, the model gives {dim} "
            "(calibrate with embeddings of the same model)"
        )
    scores, labels, eer, _ = evaluate(ids, emb, trials)
    t, p_miss, p_fa = eer_threshold(scores, labels)
    return t, (
        f"EER threshold of {trials}: {len(labels)} trials, P_miss {100 * p_miss:.2f} %, "
        f"P_fa {100 * p_fa:.2f} %, EER {100 * eer:.2f} %"
    )


def carried_threshold(embedder) -> Optional[Tuple[float, str]]:
    """The cosine EER threshold a waveform ONNX file carries (speakerlab-export took it from its exp dir's scoring of
    that checkpoint) and where it came from, or None (a torch model, or a file exported without one)."""
    t = getattr(embedder, "threshold", None)
    if t is None:
        return None
    return t, f"EER threshold carried by {embedder.path}: {embedder.meta.get('threshold_source', 'its exp dir')}"


def scored_line(checkpoint: str, model_id: str) -> Optional[Tuple[float, str]]:
    """verify.scored_threshold of this checkpoint -> (t, where it came from, with the list's size and EER), or None."""
    found = scored_threshold(checkpoint, model_id)
    if found is None:
        return None
    t, path, s = found
    said = (
        f": {s['trials']}, {s['n_trials']} trials, EER {100 * s['eer']:.2f} %"
        if {"trials", "n_trials", "eer"} <= set(s)
        else ""
    )
    return t, f"EER threshold of {path}{said}"


UNTUNED = (
    "uncalibrated default, not tuned for this model: give --threshold T or --calibration TRIALS "
    "--calibration-embeddings EMB.npz, or score a trial list with this checkpoint (a recipe's stages 4-5) and "
    "verify uses that EER threshold"
)


def verify_parser() -> argparse.ArgumentParser:
    ap = CommandParser(
        prog="speakerlab-verify",
        description="Score of two audio files and the decision: calibrated at a false-alarm rate, or at a threshold.",
        epilog="Calibrated (the model's calibration: --calibration-file, the ONNX file's, <exp>/calibration.json): "
        "'same speaker' iff llr >= the threshold of --far. Else the cosine threshold: --threshold, else the EER "
        "threshold of --calibration (the score where miss and false-alarm rates cross on that list), else the EER "
        "threshold the scoring stage found for this --checkpoint (<exp>/scores/*.json) or the one an --onnx file "
        f"carries, else {DEFAULT_THRESHOLD} "
        "(untuned). 'same speaker' iff score >= threshold.",
    )
    ap.add_argument("a", help="first audio file (any rate, first channel)")
    ap.add_argument("b", help="second audio file")
    add_source_args(ap, onnx=True)
    ap.add_argument("--far", type=float, help=f"calibrated: the false-alarm rate of the decision (default: {FAR})")
    ap.add_argument(
        "--prior", type=float, help=f"calibrated: prior of 'same speaker' in the probability (default: {PRIOR})"
    )
    th = ap.add_mutually_exclusive_group()
    th.add_argument("--calibration-file", metavar="CAL.json", help="a calibration of this model (speakerlab-calibrate)")
    th.add_argument("--threshold", type=float, help="decide 'same speaker' iff score >= this")
    th.add_argument(
        "--calibration", metavar="TRIALS", help="trial list whose EER threshold to use (with --calibration-embeddings)"
    )
    ap.add_argument(
        "--calibration-embeddings",
        metavar="EMB.npz",
        help="embeddings (ids, embeddings) of the calibration list's utterances, same model",
    )
    return ap


def run_verify(argv: Optional[Sequence[str]] = None) -> int:
    """`speakerlab-verify` without the process exit: returns the exit code."""
    ap = verify_parser()
    args = ap.parse_args(argv)
    if bool(args.calibration) != bool(args.calibration_embeddings):
        ap.error("--calibration and --calibration-embeddings go together")
    calibrated_only = [o for o, v in (("--far", args.far), ("--prior", args.prior)) if v is not None]
    if calibrated_only and (args.threshold is not None or args.calibration):
        ap.error(f"{' and '.join(calibrated_only)}: calibrated decisions only, not with --threshold or --calibration")
    args.far, args.prior = (FAR if args.far is None else args.far), (PRIOR if args.prior is None else args.prior)
    if not 0 < args.far < 1 or not 0 < args.prior < 1:
        ap.error("--far and --prior must lie in (0, 1)")
    try:
        embedder = source_embedder(ap, args)
        waves = [read_wave(embedder, args.a), read_wave(embedder, args.b)]
        emb = embedder.embed_waves(waves)
        check_finite([args.a, args.b], emb)
        found = None
        if args.threshold is None and not args.calibration:
            found = find_calibration(embedder, args.calibration_file, args.checkpoint, warn_stderr)
        if found is not None:
            seconds = tuple(len(w) / embedder.sample_rate for w in waves)
            decision = decide(emb, seconds, found, args.far, args.prior)
        elif calibrated_only:
            raise CalibrationError(
                f"{' and '.join(calibrated_only)}: no calibration of this model to decide with: give "
                "--calibration-file, an ONNX file exported with one, or a checkpoint whose exp dir has "
                "calibration.json (speakerlab-calibrate, recipe stage 8)"
            )
        else:
            if args.threshold is not None:
                threshold, source = args.threshold, "--threshold"
            elif args.calibration:
                threshold, source = calibration_threshold(args.calibration, args.calibration_embeddings, emb.shape[1])
            else:
                found_t = scored_line(args.checkpoint, embedder.model_id) if args.checkpoint else None
                found_t = found_t or carried_threshold(embedder)
                threshold, source = found_t or (DEFAULT_THRESHOLD, UNTUNED)
            score = cosine(emb[0], emb[1])
            decision = Decision(score, threshold, score >= threshold, source)
    except bad_input() as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("\n".join(decision.lines()))
    print(f"speakerlab-verify: {embedder.name}; {args.threads_line}", file=sys.stderr)
    return 0


def output_paths(out: str, kaldi: bool) -> Tuple[Path, bool]:
    """OUT -> (npz, kaldi): `x.npz` gives x.npz (and x.ark, x.scp with `kaldi`); `x.ark` gives all three."""
    path = Path(out)
    if path.suffix not in (".npz", ".ark"):
        raise UsageError(f"{out}: OUT must end in .npz or .ark")
    return path.with_suffix(".npz"), kaldi or path.suffix == ".ark"


def embed_scp(
    embedder: Union[Embedder, OnnxEmbedder], scp: str, batch_size: int = 32, pad_ratio: float = 0.0
) -> Tuple[List[str], np.ndarray]:
    """The files of a wav.scp -> (ids in file order, `(N, D)` float32). Errors name the wav.scp line;
    every id whose embedding is not finite is named."""
    table: Dict[str, Tuple[int, str]] = read_wav_scp(scp)
    if not table:
        raise ListError(f"{scp}: no entries")
    ids = list(table)
    where = {u: f"{scp}:{table[u][0]}: {u}: " for u in ids}
    parts = []
    for lo in range(0, len(ids), EMBED_CHUNK):
        chunk = ids[lo : lo + EMBED_CHUNK]
        waves = [read_wave(embedder, table[u][1], where[u]) for u in chunk]
        parts.append(embedder.embed_waves(waves, batch_size, pad_ratio))
    emb = np.concatenate(parts)
    check_finite([f"{where[u]}{table[u][1]}" for u in ids], emb)
    return ids, emb


def embed_parser() -> argparse.ArgumentParser:
    ap = CommandParser(
        prog="speakerlab-embed", description="Embeddings of the files of a wav.scp -> .npz (and Kaldi ark/scp)."
    )
    ap.add_argument("wav_scp", metavar="wav.scp", help="'<id> <path>' lines (any rate, first channel)")
    ap.add_argument("out", metavar="OUT", help="output .npz (ids, embeddings); .ark: also Kaldi ark + scp")
    add_source_args(ap, onnx=True)
    ap.add_argument("--kaldi", action="store_true", help="also write OUT's .ark and .scp (kaldiio)")
    ap.add_argument("--batch-size", type=int, default=32, help="files per model call (equal frame counts)")
    ap.add_argument(
        "--pad-ratio",
        type=float,
        default=0.0,
        help="batch files up to this much longer than the shortest, shorter ones repeated",
    )
    return ap


def source_embedder(ap: argparse.ArgumentParser, args, workers: bool = False):
    """The embedder the options of `add_source_args` name: a waveform ONNX file on onnxruntime (`--onnx`, torch
    never imported), else `speakerlab.inference.embedder.embedder_from_args` (torch).

    `workers` (speakerlab-diarize): `--threads N` on the CPU becomes N threads that each embed their own batch on one
    thread of the library's, instead of one batch at a time on the library's N intra-op threads. The embeddings are
    then the same bits whatever N (speakerlab.inference.common.embed_in_batches): with N intra-op threads they moved
    by ~2e-6 on an AMD EPYC CPU, enough to change an RTTM (bench/RESULTS.md, "The same RTTM?")."""
    if getattr(args, "onnx", None):
        from speakerlab.inference.deploy.runtime import load_onnx

        threads, args.threads_line = use_threads(args.threads)
        embedder = load_onnx(args.onnx, threads=1 if workers else threads)
    else:
        require_torch(
            "a model other than a waveform ONNX file", "use --onnx FILE (speakerlab-export --waveform makes one)"
        )
        from speakerlab.inference.embedder import embedder_from_args

        embedder = embedder_from_args(ap, args)
        threads = sys.modules["torch"].get_num_threads()
        if workers and embedder.device.type != "cpu":
            return embedder
    if workers:
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(1)
        embedder.workers = threads
        args.threads_line += f"; embeddings: {threads} worker(s) of one thread each"
    return embedder


def run_embed(argv: Optional[Sequence[str]] = None) -> int:
    """`speakerlab-embed` without the process exit: returns the exit code."""
    ap = embed_parser()
    args = ap.parse_args(argv)
    t0 = time.time()
    try:
        npz, kaldi = output_paths(args.out, args.kaldi)
        model_files = [args.checkpoint, args.weights, args.redimnet2, args.onnx]
        check_not_input([npz, *(kaldi_paths(npz) if kaldi else ())], [args.wav_scp, *model_files])
        embedder = source_embedder(ap, args)
        ids, emb = embed_scp(embedder, args.wav_scp, args.batch_size, args.pad_ratio)
        write_embeddings(npz, ids, emb, kaldi, embedder.model_id)
    except bad_input() as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    written = ", ".join(map(str, [npz, *(kaldi_paths(npz) if kaldi else ())]))
    print(
        f"speakerlab-embed: {len(ids)} embeddings of dim {emb.shape[1]} ({embedder.name}) -> {written} "
        f"in {time.time() - t0:.1f}s; {args.threads_line}",
        file=sys.stderr,
    )
    return 0


def verify(argv: Optional[Sequence[str]] = None) -> None:
    """Console script `speakerlab-verify`: exits with `run_verify`'s code."""
    sys.exit(run_verify(argv))


def embed(argv: Optional[Sequence[str]] = None) -> None:
    """Console script `speakerlab-embed`: exits with `run_embed`'s code."""
    sys.exit(run_embed(argv))
