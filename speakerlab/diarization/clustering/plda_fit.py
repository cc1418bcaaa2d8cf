"""`speakerlab-plda`: a PLDA for `speakerlab-diarize --clustering vbx`, fitted to a model's own embeddings of a
training set's speakers (a Kaldi data dir: wav.scp, utt2spk).

    speakerlab-plda --data ../mini/data/train --checkpoint ../mini/exp/campplus --out exp/diar/plda.npz
    speakerlab-plda --data data/voxceleb1 --3dspeaker campplus --weights w.pt --out plda.npz --per-utterance 2

Each utterance gives up to `--per-utterance` windows of `--window` seconds (the sub-segment length the
diarization uses: the PLDA should see embeddings like the ones it will cluster), evenly spread over it; a
shorter utterance is one window. The windows are embedded in batches, and speakerlab.diarization.clustering.plda fits
the PLDA, which records the model's digest: speakerlab-diarize refuses it with another model.

Exit codes: 0 written; 2 bad input (a message naming the file, list line or option).
"""

from __future__ import annotations

import sys
import time
from typing import List, Optional, Sequence

import numpy as np

from speakerlab.commands import CommandParser, run_command
from speakerlab.dataio.tables.lists import ListError, load_data_dir
from speakerlab.diarization.clustering.plda import PLDAError, fit_plda
from speakerlab.diarization.pipeline import DiarizeOptions, embed_window
from speakerlab.inference.cli import BAD_INPUT, source_embedder
from speakerlab.inference.common import add_source_args, read_wave
from speakerlab.outputs import check_path_output


def window_starts(duration: float, window: float, count: int) -> List[float]:
    """Up to `count` starts of `window`-second windows spread evenly over `duration` seconds (one at 0 when
    it is no longer than a window)."""
    if duration <= window or count == 1:
        return [0.0]
    return list(np.linspace(0.0, duration - window, count))


def parser() -> CommandParser:
    d = DiarizeOptions()
    ap = CommandParser(
        prog="speakerlab-plda",
        description="Fit the PLDA of --clustering vbx to a model's embeddings of a training set's speakers.",
        epilog="docs/diarization.md: VBx clustering and its PLDA.",
    )
    ap.add_argument("--data", required=True, help="a data dir with wav.scp and utt2spk (speakers not diarized later)")
    add_source_args(ap, onnx=True)
    ap.add_argument("--out", required=True, help="the PLDA file to write (.npz)")
    ap.add_argument("--window", type=float, default=d.window, help="window length, seconds (default %(default)s)")
    ap.add_argument("--per-utterance", type=int, default=3, help="windows per utterance at most (default %(default)s)")
    ap.add_argument("--dim", type=int, default=128, help="PLDA directions kept at most (default %(default)s)")
    ap.add_argument("--batch-size", type=int, default=d.batch_size, help="windows per model call (default %(default)s)")
    return ap


def fit(ap, args) -> None:
    t0 = time.time()
    check_path_output(args.out)  # a refused output costs no embedding
    data = load_data_dir(args.data)
    data.check_audio_exists()
    if len(data.speakers) < 2:  # said before any embedding, as the fit would after all of them
        raise ListError(f"{data.root / 'utt2spk'}: {len(data.speakers)} speaker: a PLDA needs utterances of 2 or more")
    embedder = source_embedder(ap, args)
    rate = embedder.sample_rate
    windows, speakers = [], []
    for utt in data.utts:
        wave = read_wave(embedder, data.wav[utt], f"{data.root / 'wav.scp'}:{data.wav_line[utt]}: ")
        duration = len(wave) / rate
        for start in window_starts(duration, args.window, args.per_utterance):
            end = min(duration, start + args.window)
            windows.append(embed_window(wave, rate, start, end, DiarizeOptions().min_embed))
            speakers.append(data.utt2spk[utt])
    emb = embedder.embed_waves(windows, max_batch=args.batch_size)
    try:
        plda = fit_plda(emb, speakers, dim=args.dim, model_id=embedder.model_id)
    except PLDAError as e:
        raise PLDAError(f"{args.data}: {e} (more utterances, or more --per-utterance windows of each)") from None
    plda.save(args.out)
    print(
        f"speakerlab-plda: {len(windows)} windows of {args.window} s from {len(data.utts)} utterances of "
        f"{len(data.speakers)} speakers ({embedder.name}) -> {args.out}: {plda.dim} directions, "
        f"phi {plda.phi[0]:.2f} .. {plda.phi[-1]:.2f} in {time.time() - t0:.1f} s",
        file=sys.stderr,
    )


def run(argv: Optional[Sequence[str]] = None) -> int:
    """`speakerlab-plda` without the process exit: returns the exit code."""
    ap = parser()
    args = ap.parse_args(argv)
    if not args.window > 0:
        ap.error(f"--window must be > 0 seconds, got {args.window:g}")
    for name, value in (
        ("--per-utterance", args.per_utterance),
        ("--dim", args.dim),
        ("--batch-size", args.batch_size),
    ):
        if value < 1:
            ap.error(f"{name} must be 1 or more, got {value}")
    return run_command(lambda: fit(ap, args), BAD_INPUT)


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Console script `speakerlab-plda`: exits with `run`'s code."""
    sys.exit(run(argv))
