"""The console scripts `speakerlab-enrol` (build and update a gallery) and `speakerlab-identify` (name the speaker of
audio files, or say "unknown" / "too short").

    speakerlab-enrol add people.npz alice a1.wav a2.wav --onnx campplus.onnx     # or --checkpoint exp/campplus
    speakerlab-enrol remove people.npz alice
    speakerlab-enrol list people.npz
    speakerlab-identify people.npz x.wav y.wav --onnx campplus.onnx --fpir 0.01 --min-seconds 1.0

`add` embeds the files with the model (any rate, first channel; speakerlab.inference) and adds them to the speaker
(new or enrolled), creating the gallery when the file does not exist; a gallery of another model is refused. `list`
prints `speaker<TAB>files<TAB>seconds` and the model digest. Every update rewrites the file atomically
(speakerlab.identification.gallery): a kill mid-update leaves the previous gallery.

`speakerlab-identify` prints one line per file, `FILE<TAB>answer (details)`: the best speaker with its mean
calibrated LLR, the margin over the second and the threshold of `--fpir`; or `unknown (best X, ...)`; or
`too short (S s)` under `--min-seconds`. The calibration: `--calibration-file`, else the ONNX file's, else
`<exp>/calibration.json` of `--checkpoint` (speakerlab.inference.verify.find_calibration); without one, an error.
With `--onnx` neither command imports torch. Bad input: one `error:` line, exit 2.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional, Sequence

from speakerlab.commands import CommandParser
from speakerlab.identification.gallery import Gallery, GalleryError, read_gallery, write_gallery
from speakerlab.identification.identify import MIN_SECONDS, identify_many, threshold_note
from speakerlab.inference.cli import bad_input, source_embedder
from speakerlab.inference.common import add_source_args, check_finite, read_wave, warn_stderr
from speakerlab.inference.verify import find_calibration
from speakerlab.outputs import check_path_output
from speakerlab.scoring.calibration_file import CalibrationError


def embed_files(embedder, files: Sequence[str]):
    """Files -> (`(n, D)` embeddings, seconds (n,)); a file too short for an embedding is an error naming it."""
    waves = [read_wave(embedder, f) for f in files]
    emb = embedder.embed_waves(waves)
    check_finite(list(files), emb)
    return emb, [len(w) / embedder.sample_rate for w in waves]


def enrol_parser() -> CommandParser:
    ap = CommandParser(prog="speakerlab-enrol", description="Build or update a gallery of enrolled speakers.")
    sub = ap.add_subparsers(dest="action", required=True)
    # The action first, then the gallery (as `git remote add`): `speakerlab-enrol list --help` is list's help.
    actions = {
        "add": "enrol audio files of a speaker (new, or more files of an enrolled one)",
        "remove": "drop a speaker and all their files",
        "list": "the enrolled speakers: files and seconds each",
    }
    parsers = {}
    for action, text in actions.items():
        parsers[action] = sub.add_parser(action, help=text, description=text[0].upper() + text[1:] + ".")
        parsers[action].add_argument("gallery", help="the gallery file (.npz); add creates it")
    add, remove = parsers["add"], parsers["remove"]
    add.add_argument("speaker", help="the speaker's name (no spaces)")
    add.add_argument("files", nargs="+", help="audio files of that speaker (any rate, first channel)")
    add_source_args(add, onnx=True)
    remove.add_argument("speaker", help="the enrolled speaker's name")
    return ap


def run_enrol(argv: Optional[Sequence[str]] = None) -> int:
    """`speakerlab-enrol` without the process exit: the exit code."""
    ap = enrol_parser()
    args = ap.parse_args(argv)
    where = str(args.gallery)
    try:
        check_path_output(args.gallery)  # read and rewritten whole: a device or a pipe is neither
        if args.action == "add":
            embedder = source_embedder(ap, args)
            emb, seconds = embed_files(embedder, args.files)
            if Path(args.gallery).exists():
                g = read_gallery(args.gallery)
                g.check_model(embedder.model_id, where)
            else:
                g = Gallery.empty(embedder.model_id, emb.shape[1])
            g.add(args.speaker, args.files, emb, seconds)
            write_gallery(args.gallery, g)
            print(f"enrolled {len(args.files)} file(s) of {args.speaker} ({sum(seconds):.1f} s) -> {where}")
        elif args.action == "remove":
            g = read_gallery(args.gallery)
            n = g.remove(args.speaker, where)
            write_gallery(args.gallery, g)
            print(f"removed {args.speaker} ({n} file(s)) from {where}")
        else:
            g = read_gallery(args.gallery)
            for speaker, count, seconds in g.summary():
                print(f"{speaker}\t{count}\t{seconds:.1f}")
            print(f"{len(g.names())} speaker(s), model {g.model_id[:12]}", file=sys.stderr)
    except (GalleryError, *bad_input()) as e:  # bad_input holds ValueError, so OutputError
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def identify_parser() -> CommandParser:
    ap = CommandParser(prog="speakerlab-identify", description="Name the enrolled speaker of audio files, or none.")
    ap.add_argument("gallery", help="the gallery file of speakerlab-enrol")
    ap.add_argument("files", nargs="+", help="audio files to identify")
    add_source_args(ap, onnx=True)
    ap.add_argument("--calibration-file", metavar="CAL.json", help="a calibration of this model (speakerlab-calibrate)")
    ap.add_argument("--fpir", type=float, default=0.01, help="false-positive identification rate of 'unknown'")
    ap.add_argument("--min-seconds", type=float, default=MIN_SECONDS, help="shorter files: 'too short', no guess")
    return ap


def run_identify(argv: Optional[Sequence[str]] = None) -> int:
    """`speakerlab-identify` without the process exit: the exit code."""
    ap = identify_parser()
    args = ap.parse_args(argv)
    if not 0 < args.fpir < 1:
        ap.error("--fpir must lie in (0, 1)")
    try:
        g = read_gallery(args.gallery)
        if not g.names():  # (speakerlab-enrol remove of the last speaker leaves one)
            enrol = f"speakerlab-enrol add {args.gallery} NAME FILES..."
            raise GalleryError(f"{args.gallery}: no speaker enrolled: {enrol}")
        embedder = source_embedder(ap, args)
        g.check_model(embedder.model_id, str(args.gallery))
        found = find_calibration(embedder, args.calibration_file, args.checkpoint, warn_stderr)
        if found is None:
            raise CalibrationError(
                "no calibration of this model: give --calibration-file, an ONNX file exported with one, or a "
                "checkpoint whose exp dir has calibration.json (speakerlab-calibrate, recipe stage 8)"
            )
        emb, seconds = embed_files(embedder, args.files)
        results = identify_many(g, found[0], emb, seconds, args.fpir, args.min_seconds)
        print(threshold_note(found[0], args.fpir, len(g.names())), file=sys.stderr)
    except (GalleryError, *bad_input()) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for path, r in zip(args.files, results):
        print(f"{path}\t{r.line()}")
    return 0


def enrol(argv: Optional[Sequence[str]] = None) -> None:
    """Console script `speakerlab-enrol`."""
    sys.exit(run_enrol(argv))


def identify(argv: Optional[Sequence[str]] = None) -> None:
    """Console script `speakerlab-identify`."""
    sys.exit(run_identify(argv))
