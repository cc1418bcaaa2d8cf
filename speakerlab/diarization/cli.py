"""`speakerlab-diarize`: who spoke when in audio files or the recordings of a wav.scp -> RTTM (+ JSON).

    speakerlab-diarize meeting.wav --checkpoint exp/campplus                        # RTTM on stdout
    speakerlab-diarize --wav-scp data/conv/wav.scp --checkpoint exp/campplus --rttm exp/diar/hyp.rttm \
        --json exp/diar/hyp.json --embeddings --max-speakers 8
    speakerlab-diarize call.wav --3dspeaker campplus --weights campplus_cn_en_common.pt --num-speakers 2
    speakerlab-diarize --wav-scp wav.scp --redimnet2 b6-vox2-lm.pt --vad oracle --segments ref.rttm \
        --reco2num-spk data/conv/reco2num_spk

Any model `speakerlab-embed` takes (our checkpoints, 3D-Speaker state dicts, ReDimNet2 releases). The
recording id of a file given on the command line is its name without the extension. Speakers are named
spk00, spk01, ... per recording, in order of first appearance. The JSON holds per recording its duration,
speech regions, turns and speaker centroids (unit-length mean embeddings); with --embeddings also every
sub-segment with its speaker and embedding; and the model that made them (`model`, and `model_id`: a speakerlab
checkpoint's content digest). Messages go to stderr, one line per recording (with the wall seconds of its
stages: speech detection, embeddings, clustering).

Every file of the list is checked before any work ("no such file: PATH (wav.scp line N)"), and the RTTM is
written after each recording, so a failure in a later one loses none that finished (the JSON, written once,
holds those too).

A recording shorter than the model's shortest input (its `min_samples`) is refused in one line naming it (the
words of every command); a sub-segment shorter than a window is widened within the recording, and a recording
shorter than the window is repeated up to it (speakerlab.diarization.pipeline).

Exit codes: 0 done (a recording without speech gets no RTTM line, and a message says so); 2 bad input (a
message naming the file, the list line or the option).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

from speakerlab.commands import CommandParser, run_command
from speakerlab.dataio.audio import AudioError
from speakerlab.dataio.tables.lists import ListError, read_table, read_wav_scp
from speakerlab.dataio.tables.rttm import read_reco2num_spk, read_speech, rttm_lines
from speakerlab.diarization.cache import FrontCache
from speakerlab.diarization.clustering.cluster import METHODS, SpeakerCount
from speakerlab.diarization.clustering.plda import load_plda
from speakerlab.diarization.pipeline import Diarization, DiarizeOptions, Diarizer
from speakerlab.diarization.segmenter import OnnxSegmenter
from speakerlab.diarization.vad import VADS, make_vad
from speakerlab.inference.cli import BAD_INPUT, source_embedder, warn_stderr
from speakerlab.inference.common import add_source_args
from speakerlab.outputs import OutputError, check_folder_output, check_path_output, is_special, write_lines

if TYPE_CHECKING:  # torch's Embedder or the torch-free OnnxEmbedder (--onnx): neither imported here
    from speakerlab.inference.embedder import Embedder


def recordings(args) -> List[Tuple[str, str, str]]:
    """(recording id, audio path, where for messages) from --wav-scp or the positional files; every file is
    checked before any work starts (`check_files`)."""
    if args.wav_scp:
        out = [
            (reco, path, f"{args.wav_scp}:{lineno}: {reco}: ")
            for reco, (lineno, path) in read_wav_scp(args.wav_scp).items()
        ]
        if not out:
            raise ListError(f"{args.wav_scp}: no recordings in it (an empty wav.scp)")
    else:
        out, seen = [], {}
        for path in args.audio:
            reco = re.sub(r"\s+", "_", Path(path).stem)
            if reco in seen:
                raise ListError(f"{path} and {seen[reco]} share the recording id '{reco}': give a wav.scp instead")
            seen[reco] = path
            out.append((reco, path, ""))
    check_files(args, out)
    return out


def check_files(args, items: Sequence[Tuple[str, str, str]]) -> None:
    """Every audio file exists and is readable audio, before the first recording is diarized: a bad last line
    of a long list costs nothing. The message names the file and its wav.scp line."""
    import soundfile as sf

    lines = (
        {reco: f" ({args.wav_scp} line {n})" for reco, (n, _) in read_wav_scp(args.wav_scp).items()}
        if args.wav_scp
        else {}
    )
    for reco, path, _ in items:
        line = lines.get(reco, "")
        if not Path(path).is_file():
            raise ListError(f"no such file: {path}{line}")
        try:
            sf.info(path)
        except (RuntimeError, sf.LibsndfileError) as e:
            raise AudioError(f"{path}: cannot read audio: {e}{line}") from None


def speaker_counts(args, recos: Sequence[str]) -> Dict[str, SpeakerCount]:
    """Each recording's allowed speaker count from --num-speakers / --min-speakers / --max-speakers or
    --reco2num-spk (which must name every recording)."""
    if args.reco2num_spk:
        table = read_reco2num_spk(args.reco2num_spk)
        missing = [r for r in recos if r not in table]
        if missing:
            raise ListError(f"{args.reco2num_spk}: no speaker count for '{missing[0]}' ({len(missing)} recording(s))")
        low, high = speaker_range(args)
        outside = [r for r in recos if not low <= table[r] <= high]
        if outside:  # as --num-speakers outside the range: a contradiction, not a count to honour or a range to drop
            line = read_table(args.reco2num_spk)[outside[0]][0]
            raise ListError(
                f"{args.reco2num_spk}:{line}: {table[outside[0]]} speakers for '{outside[0]}' contradicts "
                f"--min-speakers {low} / --max-speakers {high} ({len(outside)} recording(s) outside)"
            )
        return {r: SpeakerCount.exactly(table[r]) for r in recos}
    if args.num_speakers is not None:
        count = SpeakerCount.exactly(args.num_speakers)
    else:
        count = SpeakerCount(*speaker_range(args))
    return {r: count for r in recos}


def speaker_range(args) -> tuple:
    """(--min-speakers, --max-speakers) with their defaults: 0 is a value (refused), not "unset"."""
    low = 1 if args.min_speakers is None else args.min_speakers
    return low, DEFAULT_MAX_SPEAKERS if args.max_speakers is None else args.max_speakers


def as_json(reco: str, path: str, d: Diarization, embeddings: bool) -> dict:
    out = {
        "id": reco,
        "path": path,
        "duration": round(d.duration, 3),
        "speech": [[round(s, 3), round(e, 3)] for s, e in d.speech],
        "speakers": d.speakers,
        "turns": [{"start": round(t.start, 3), "end": round(t.end, 3), "speaker": t.speaker} for t in d.turns],
        "centroids": {name: c.tolist() for name, c in zip(d.speakers, d.centroids)},
    }
    if embeddings:
        out["subsegments"] = [
            {"start": round(float(s), 3), "end": round(float(e), 3), "speaker": d.speakers[k], "embedding": v.tolist()}
            for (s, e), k, v in zip(d.subsegments, d.labels, d.embeddings)
        ]
    return out


DEFAULT_MAX_SPEAKERS = 20

# The options that are DiarizeOptions fields of the same name (--merge-cosine sets merge_cosine): their help.
TUNING = {
    "window": "sub-segment length, seconds",
    "hop": "sub-segment step, seconds",
    "pruning": "spectral: fraction of affinities kept per row (6 to 30 of them)",
    "threshold": "ahc: cosine distance where clusters stop joining",
    "merge_cosine": "estimated counts: merge speakers whose centroids' cosine exceeds this (1: never)",
    "seed": "k-means seed: the same input and seed give the same output",
    "max_units": "long recordings: sub-segments beyond this are clustered as this many units of neighbours, "
    "then each assigned to its nearest speaker (0: no limit)",
    "batch_size": "sub-segments per model call",
    "fa": "vbx: scale of the acoustic log-likelihoods",
    "fb": "vbx: weight of the speaker prior (larger: fewer speakers)",
    "loop_p": "vbx: probability that the next sub-segment has the same speaker",
    "vbx_init": "vbx: cosine distance where the AHC that starts it stops joining",
    "seg_loop_p": "--segmentation with vbx: loop_p on its (window, local speaker) embeddings",
    "seg_window": "--segmentation: the model's window, seconds",
    "seg_step": "--segmentation: step between its windows, seconds (rounded to whole frames)",
}


def parser() -> argparse.ArgumentParser:
    ap = CommandParser(
        prog="speakerlab-diarize",
        description="Who spoke when: audio files or a wav.scp -> RTTM (and JSON).",
        epilog="docs/diarization.md: the steps, the options, the bad-input catalogue, DER.",
    )
    ap.add_argument("audio", nargs="*", help="audio files (any rate; the first channel of several)")
    ap.add_argument("--wav-scp", help="'<recording> <path>' lines instead of files")
    add_source_args(ap, onnx=True)
    ap.add_argument("--rttm", help="write the RTTM here (default: stdout)")
    ap.add_argument("--json", help="also write a JSON of segments, speech and centroids here")
    ap.add_argument("--embeddings", action="store_true", help="the JSON also holds every sub-segment's embedding")
    ap.add_argument(
        "--vad",
        choices=(*VADS, "oracle"),
        default="silero",
        help="speech detection; oracle: --segments (default %(default)s)",
    )
    ap.add_argument("--segments", help="oracle speech: an RTTM (its turns' union) or a Kaldi segments file")
    ap.add_argument(
        "--segmentation",
        metavar="MODEL",
        help="segmentation model's ONNX file (speakerlab-segmentation-train): local speakers per window instead of "
        "the VAD, an embedding per window and local speaker, two speakers where it hears two",
    )
    n = ap.add_argument_group("speaker count (default: estimated between --min-speakers and --max-speakers)")
    n.add_argument("--num-speakers", type=int, help="exactly this many speakers in every recording")
    n.add_argument("--min-speakers", type=int, help="at least this many speakers per recording (default 1)")
    n.add_argument(
        "--max-speakers",
        type=int,
        help=f"at most this many speakers per recording (default {DEFAULT_MAX_SPEAKERS})",
    )
    n.add_argument("--reco2num-spk", metavar="FILE", help="'<recording> <count>' lines: each recording's own count")
    d = DiarizeOptions()
    ap.add_argument(
        "--clustering",
        choices=METHODS,
        default=d.method,
        help="spectral: count by eigengap, k-means on the eigenvectors; ahc: average linkage cut at --threshold; "
        "vbx: Bayesian HMM on --plda, started from AHC",
    )
    ap.add_argument(
        "--cache",
        metavar="DIR",
        help="keep each recording's VAD regions and sub-segment embeddings here, and reuse those a run before kept "
        "for the same audio, VAD, model and window settings (the recipes' systems share EXP/cache)",
    )
    ap.add_argument("--plda", metavar="FILE", help="vbx: the PLDA speakerlab-plda fitted to this model's embeddings")
    for field, text in TUNING.items():
        default = getattr(d, field)  # DiarizeOptions' own defaults and types
        flag = "--" + field.replace("_", "-")
        ap.add_argument(flag, type=type(default), default=default, help=f"{text} (default %(default)s)")
    return ap


def check_args(ap: argparse.ArgumentParser, args) -> None:
    if bool(args.audio) == bool(args.wav_scp):
        ap.error("give audio files or --wav-scp (one of the two)")
    if (args.vad == "oracle") != bool(args.segments):
        ap.error("--vad oracle and --segments go together")
    if args.segmentation and args.segments:
        ap.error("--segmentation finds the speech itself: not with --segments")
    if args.num_speakers is not None and args.num_speakers < 1:
        ap.error(f"--num-speakers must be >= 1, got {args.num_speakers}")
    low, high = speaker_range(args)
    if not 1 <= low <= high:
        ap.error(f"need 1 <= --min-speakers <= --max-speakers, got {low}, {high}")
    if args.reco2num_spk and args.num_speakers:
        ap.error("--num-speakers and --reco2num-spk exclude each other")
    if (args.clustering == "vbx") != bool(args.plda):
        ap.error("--clustering vbx and --plda go together (speakerlab-plda fits a PLDA)")
    if args.num_speakers is not None and not low <= args.num_speakers <= high:
        ap.error(f"--num-speakers {args.num_speakers} contradicts --min-speakers {low} / --max-speakers {high}")


def run(argv: Optional[Sequence[str]] = None) -> int:
    """`speakerlab-diarize` without the process exit: returns the exit code."""
    ap = parser()
    args = ap.parse_args(argv)
    check_args(ap, args)
    return run_command(lambda: diarize(ap, args), BAD_INPUT)


def diarize(ap: argparse.ArgumentParser, args) -> None:
    """Every recording, its RTTM written as it finishes; the JSON at the end (or when one fails)."""
    t0 = time.time()
    tuning = {field: getattr(args, field) for field in TUNING}
    if tuning["merge_cosine"] == 1:  # 1: never merge (above 1 the options refuse it)
        tuning["merge_cosine"] = None
    options = DiarizeOptions(method=args.clustering, **tuning)
    check_outputs(args)
    items = recordings(args)
    counts = speaker_counts(args, [r for r, _, _ in items])
    speech = read_speech(args.segments) if args.segments else None
    plda = load_plda(args.plda) if args.plda else None
    cache = FrontCache(check_folder_output(args.cache)) if args.cache else None
    # The segmenter on one thread whatever --threads: on two its frame scores moved by 1.9e-6 (measured), enough to
    # flip a frame's class near a tie and change the RTTM (bench/diarization_repeat.py); it is a small part of the time.
    segmenter = OnnxSegmenter(args.segmentation, threads=1) if args.segmentation else None
    vad = None if speech is not None or segmenter is not None else make_vad(args.vad)
    diarizer = Diarizer(source_embedder(ap, args, workers=True), vad, options, plda, cache, segmenter)
    results, audio_seconds = [], 0.0
    try:
        for reco, path, where in items:
            t1 = time.time()
            try:
                d = diarizer.diarize_file(
                    path, counts[reco], None if speech is None else speech.get(reco, []), warn_stderr
                )
            except AudioError as e:  # too short, or unreadable past its header: named by its list line
                raise AudioError(f"{where}{e}") from None
            for note in d.notes:
                warn_stderr(f"{where}{note}")
            audio_seconds += d.duration
            results.append((reco, path, d))
            write_rttm(args, results)
            print(
                f"speakerlab-diarize: {reco}: {d.duration:.1f} s, {len(d.speakers)} speaker(s), "
                f"{len(d.turns)} turn(s) in {time.time() - t1:.1f} s ("
                + ", ".join(f"{stage} {took:.1f} s" for stage, took in d.seconds.items())
                + ")"
                + (f" ({' and '.join(d.cached)} from the cache)" if d.cached else ""),
                file=sys.stderr,
            )
    finally:  # a recording that fails keeps the ones before it: their RTTM is written, and the JSON here
        if results and len(results) < len(items):
            print(f"speakerlab-diarize: {len(results)} of {len(items)} recording(s) done and written", file=sys.stderr)
        write_json(args, results, diarizer.embedder)
    elapsed = time.time() - t0
    print(
        f"speakerlab-diarize: {len(results)} recording(s), {audio_seconds / 3600:.3f} h of audio in {elapsed:.1f} s "
        f"({elapsed / max(audio_seconds, 1e-9) * 3600:.0f} s per hour; {diarizer.embedder.name}; {args.threads_line})",
        file=sys.stderr,
    )


def check_outputs(args) -> None:
    """--rttm and --json before any work: a folder there is refused (the JSON is written after the last recording),
    and so is one file named twice, or an input file named as an output (it would be overwritten)."""
    taken = {}
    for flag in ("--wav-scp", "--segments", "--reco2num-spk", "--plda", "--rttm", "--json"):
        path = getattr(args, flag[2:].replace("-", "_"))
        if not path or is_special(path):  # a device (/dev/stdout) takes either
            continue
        real = os.path.realpath(path)
        if flag in ("--rttm", "--json"):
            if real in taken:
                raise OutputError(f"{flag} {path} is the file of {taken[real]}: give each output its own file")
            check_path_output(path)
        taken[real] = f"{flag} {path}"


def write_rttm(args, results) -> None:
    """The RTTM of the recordings done so far, after each one (a file rewritten whole; on stdout, the newest
    recording's lines): a later failure or a kill loses nothing finished."""
    if args.rttm:
        write_lines(args.rttm, [line for reco, _, d in results for line in rttm_lines(reco, d.turns)])
    else:
        reco, _, d = results[-1]
        sys.stdout.write("".join(line + "\n" for line in rttm_lines(reco, d.turns)))
        sys.stdout.flush()


def write_json(args, results, embedder: Embedder) -> None:
    """The JSON of the recordings done (written whole once, at the end or when one fails: with --embeddings it
    is large), naming the model (`model_id`: a speakerlab checkpoint's content digest, as embeddings files
    record it)."""
    if args.json and results:
        doc = {
            "model": embedder.name,
            "model_id": embedder.model_id,
            "recordings": [as_json(reco, path, d, args.embeddings) for reco, path, d in results],
        }
        write_lines(args.json, [json.dumps(doc)])


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Console script `speakerlab-diarize`: exits with `run`'s code."""
    sys.exit(run(argv))
