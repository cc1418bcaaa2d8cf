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
read audio with `speakerlab.dataio.resample.read_for_model`: any sample rate (resampled in torch to the model's),
multi-channel files as their first channel (with a warning on stderr naming the file). `speakerlab-embed --onnx`
runs a waveform ONNX file (speakerlab-export --waveform) through speakerlab.inference.runtime instead: no torch,
resampling by scipy's resample_poly (the same filter); this module imports torch only for the other sources.

`speakerlab-verify` prints three lines on stdout:
    score 0.734512                          the cosine of the two embeddings
    threshold 0.412300 (<where it came from>)
    same speaker                            or: different speakers (same iff score >= threshold)
The threshold is, first found of:
  1. `--threshold`;
  2. the EER threshold of `--calibration` (a trial list, `enrol test target|nontarget`) scored by cosine on
     `--calibration-embeddings` (an .npz of the same model, e.g. from `speakerlab-embed`): among the list's
     distinct scores t, deciding "same" iff score >= t, the t where |P_miss(t) - P_fa(t)| is smallest (the
     lower t on a tie), i.e. the operating point where the miss and false-alarm rates of that list cross;
  3. for `--checkpoint` (an exp dir or a checkpoint in one), the EER threshold the scoring stage found for
     this very checkpoint: a `<exp>/scores/**/*.json` of `speakerlab-score` (plain cosine) whose embeddings it
     made (the checkpoint's content digest, which extraction and scoring record as `model_id`);
  4. DEFAULT_THRESHOLD: a placeholder, not tuned for any model, and the threshold line says so.

`speakerlab-embed` reads `<id> <path>` lines and writes OUT: `.npz` with `ids` (wav.scp order) and
`embeddings (N, D)` float32 (`speakerlab.dataio.embeddings`, as extraction writes); an OUT ending in `.ark`, or
`--kaldi`, also writes a Kaldi float-vector ark and its scp (kaldiio) next to the .npz. Nothing is written when a
file fails or an embedding is not finite.

Exit codes: 0 done; 2 bad input (a message on stderr naming the file, or the wav.scp line).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from speakerlab.commands import CommandParser, require_torch
from speakerlab.dataio.audio import AudioError
from speakerlab.dataio.embeddings import kaldi_paths, read_embeddings, write_embeddings
from speakerlab.dataio.lists import ListError, read_wav_scp
from speakerlab.inference.common import MIN_FRAMES, NonFiniteEmbedding, add_source_args, check_finite
from speakerlab.scoring.metrics import eer_point, error_rates

# torch is imported by the functions that load a torch model (speakerlab.inference.embedder), not here:
# `speakerlab-embed --onnx` runs in the torch-free install (runtime/pyproject.toml).
if TYPE_CHECKING:
    from speakerlab.inference.embedder import Embedder
    from speakerlab.inference.runtime import OnnxEmbedder

DEFAULT_THRESHOLD = 0.5
EMBED_CHUNK = 256  # files decoded at a time by speakerlab-embed: bounds memory on long lists
# ImportError: a model on a self-supervised encoder without the [ssl] extra (the message names it). A checkpoint
# that cannot be read is a SourceError (a ValueError) by the time it leaves speakerlab.sources.
BAD_INPUT = (ListError, AudioError, NonFiniteEmbedding, ValueError, OSError, ImportError)


def bad_input() -> tuple:
    """BAD_INPUT, and speakerlab.checkpoint's CheckpointError once a torch path has loaded that module (importing
    it here would import torch on the ONNX path)."""
    checkpoint = sys.modules.get("speakerlab.checkpoint")
    return BAD_INPUT + ((checkpoint.CheckpointError,) if checkpoint else ())


class UsageError(ValueError):
    """An argument combination or value the parser cannot check; exit 2 with the message."""


def warn_stderr(msg: str) -> None:
    print(f"warning: {msg}", file=sys.stderr)


def read_wave(embedder: Union[Embedder, OnnxEmbedder], path: str, where: str = "") -> np.ndarray:
    """`path` at the embedder's rate, `(samples,)` float32; fewer than MIN_FRAMES feature frames is an error.
    `where` prefixes messages (a wav.scp line)."""
    warn = (lambda m: warn_stderr(f"{where}{m}")) if where else warn_stderr
    try:
        wave = embedder.read(path, warn)
    except AudioError as e:
        raise AudioError(f"{where}{e}") from None
    frames = embedder.num_frames(len(wave))
    if frames < MIN_FRAMES:
        raise AudioError(
            f"{where}{path}: too short for an embedding: {len(wave) / embedder.sample_rate:.3f} s, {frames} feature "
            f"frame(s), need {MIN_FRAMES}"
        )
    return wave


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
    from speakerlab.scoring.score import evaluate  # the scoring stack only when calibrating

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


def exp_dir_of(checkpoint: str) -> Path:
    """The exp dir of `--checkpoint`: the folder itself, or the run a checkpoint file belongs to."""
    p = Path(checkpoint)
    if p.is_dir():
        return p.parent if p.name == "checkpoints" else p
    return p.parent.parent if p.parent.name == "checkpoints" else p.parent


def scored_threshold(checkpoint: str, model_id: str) -> Optional[Tuple[float, str]]:
    """The EER threshold of the first `<exp>/scores/**/*.json` (by name) scored by plain cosine on embeddings
    of the model `model_id` -> (t, where it came from), or None (no such scoring, or no model id)."""
    if not model_id:
        return None
    for path in sorted((exp_dir_of(checkpoint) / "scores").rglob("*.json")):
        try:
            s = json.loads(path.read_text())
            scoring = s["scoring"]
            if scoring.get("model_id") != model_id or scoring.get("method") != "cosine":
                continue
            t = float(s["operating_points"]["eer"]["threshold"])
            return t, f"EER threshold of {path}: {s['trials']}, {s['n_trials']} trials, EER {100 * s['eer']:.2f} %"
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # not a scoring summary
    return None


UNTUNED = (
    "uncalibrated default, not tuned for this model: give --threshold T or --calibration TRIALS "
    "--calibration-embeddings EMB.npz, or score a trial list with this checkpoint (a recipe's stages 4-5) and "
    "verify uses that EER threshold"
)


def verify_parser() -> argparse.ArgumentParser:
    ap = CommandParser(
        prog="speakerlab-verify",
        description="Cosine score of two audio files and the decision at a threshold.",
        epilog="Threshold: --threshold, else the EER threshold of --calibration (the score where miss and false-alarm "
        "rates cross on that list), else the EER threshold the scoring stage found for this --checkpoint "
        f"(<exp>/scores/*.json), else {DEFAULT_THRESHOLD} (untuned). 'same speaker' iff score >= threshold.",
    )
    ap.add_argument("a", help="first audio file (any rate, first channel)")
    ap.add_argument("b", help="second audio file")
    add_source_args(ap)
    th = ap.add_mutually_exclusive_group()
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
    try:
        from speakerlab.inference.embedder import embedder_from_args

        embedder = embedder_from_args(ap, args)
        waves = [read_wave(embedder, args.a), read_wave(embedder, args.b)]
        emb = embedder.embed_waves(waves)
        check_finite([args.a, args.b], emb)
        if args.threshold is not None:
            threshold, source = args.threshold, "--threshold"
        elif args.calibration:
            threshold, source = calibration_threshold(args.calibration, args.calibration_embeddings, emb.shape[1])
        else:
            found = scored_threshold(args.checkpoint, embedder.model_id) if args.checkpoint else None
            threshold, source = found or (DEFAULT_THRESHOLD, UNTUNED)
    except bad_input() as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    score = cosine(emb[0], emb[1])
    print(f"score {score:.6f}")
    print(f"threshold {threshold:.6f} ({source})")
    print("same speaker" if score >= threshold else "different speakers")
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


def source_embedder(ap: argparse.ArgumentParser, args):
    """The embedder the options of `add_source_args` name: a waveform ONNX file on onnxruntime (`--onnx`, torch
    never imported), else `speakerlab.inference.embedder.embedder_from_args` (torch)."""
    if getattr(args, "onnx", None):
        from speakerlab.inference.runtime import load_onnx

        return load_onnx(args.onnx)
    require_torch("a model other than a waveform ONNX file", "use --onnx FILE (speakerlab-export --waveform makes one)")
    from speakerlab.inference.embedder import embedder_from_args

    return embedder_from_args(ap, args)


def run_embed(argv: Optional[Sequence[str]] = None) -> int:
    """`speakerlab-embed` without the process exit: returns the exit code."""
    ap = embed_parser()
    args = ap.parse_args(argv)
    t0 = time.time()
    try:
        npz, kaldi = output_paths(args.out, args.kaldi)
        embedder = source_embedder(ap, args)
        ids, emb = embed_scp(embedder, args.wav_scp, args.batch_size, args.pad_ratio)
        write_embeddings(npz, ids, emb, kaldi, embedder.model_id)
    except bad_input() as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    written = ", ".join(map(str, [npz, *(kaldi_paths(npz) if kaldi else ())]))
    print(
        f"speakerlab-embed: {len(ids)} embeddings of dim {emb.shape[1]} ({embedder.name}) -> {written} "
        f"in {time.time() - t0:.1f}s",
        file=sys.stderr,
    )
    return 0


def verify(argv: Optional[Sequence[str]] = None) -> None:
    """Console script `speakerlab-verify`: exits with `run_verify`'s code."""
    sys.exit(run_verify(argv))


def embed(argv: Optional[Sequence[str]] = None) -> None:
    """Console script `speakerlab-embed`: exits with `run_embed`'s code."""
    sys.exit(run_embed(argv))
