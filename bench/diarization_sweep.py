"""Clustering settings against DER on a set of conversations: each recording is embedded once (Silero VAD,
the default windows), then re-clustered for every setting; prints DER (collar 0.25, overlap scored) and how
many recordings got the reference's speaker count. For choosing defaults on conversations of the mini
corpus's validation speakers, not its test speakers (the figures of docs/diarization.md).

    speakerlab-synth-conversations --data egs/mini/data/val --out /tmp/valconv --num-conversations 10 \
        --noise egs/mini/data/musan/noise --seed 100
    OMP_NUM_THREADS=2 python bench/diarization_sweep.py --checkpoint egs/mini/exp/campplus --data /tmp/valconv
    OMP_NUM_THREADS=1 python bench/diarization_sweep.py --checkpoint egs/mini/exp/campplus --data /tmp/valconv \
        --plda exp/diar/plda.npz --cache /tmp/cache --grid vbx --fb 5 10 17 30 --loop-p 0.5 0.8 0.99

`--grid vbx` sweeps VBx (`--plda`: speakerlab-plda's file for the model) over every combination of `--fa`,
`--fb`, `--loop-p` and `--init-threshold`, and prints, for the best setting by count (then DER), how many
recordings of each true count it got right. `--cache DIR` keeps the VAD regions and embeddings for the next run.
"""

from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path

from speakerlab.dataio.tables.lists import read_wav_scp
from speakerlab.dataio.tables.rttm import read_rttm, read_uem
from speakerlab.diarization import DiarizeOptions, Diarizer, SpeakerCount, make_vad
from speakerlab.diarization.cache import FrontCache
from speakerlab.diarization.clustering.cluster import cluster
from speakerlab.diarization.clustering.plda import load_plda
from speakerlab.diarization.clustering.vbx import VBxParams
from speakerlab.diarization.der import count_agreement, der
from speakerlab.diarization.pipeline import labels_to_turns, subsegments
from speakerlab.inference.embedder import load_embedder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--data", required=True, help="folder with wav.scp, rttm, uem")
    ap.add_argument(
        "--grid",
        choices=("spectral-ahc", "vbx", "spectral"),
        default="spectral-ahc",
        help="spectral: its defaults only",
    )
    ap.add_argument("--plda", help="vbx: the PLDA of the model (speakerlab-plda)")
    ap.add_argument("--cache", help="keep and reuse the VAD regions and embeddings here")
    d = VBxParams()
    for flag, default in (
        ("--fa", d.fa),
        ("--fb", d.fb),
        ("--loop-p", d.loop_p),
        ("--init-threshold", d.init_threshold),
    ):
        ap.add_argument(flag, type=float, nargs="+", default=[default], help=f"vbx values (default {default})")
    args = ap.parse_args()
    if args.grid == "vbx" and not args.plda:
        ap.error("--grid vbx needs --plda")
    data = Path(args.data)
    ref, uem = read_rttm(data / "rttm"), read_uem(data / "uem")
    options = DiarizeOptions()
    cache = FrontCache(args.cache) if args.cache else None
    diarizer = Diarizer(load_embedder(args.checkpoint, device="cpu"), make_vad("silero"), options, cache=cache)
    t0 = time.time()
    done = {reco: diarizer.diarize_file(path) for reco, (_, path) in read_wav_scp(data / "wav.scp").items()}
    print(f"embedded {len(done)} recordings in {time.time() - t0:.1f} s")
    if args.grid == "vbx":
        plda = load_plda(args.plda)
        grid = [
            (f"vbx fa {fa:<4} fb {fb:<4} loop_p {lp:<4} init {it:<4}", dict(method="vbx", plda=plda, vbx_params=p))
            for fa, fb, lp, it in itertools.product(args.fa, args.fb, args.loop_p, args.init_threshold)
            for p in [VBxParams(fa=fa, fb=fb, loop_p=lp, init_threshold=it)]
        ]
    elif args.grid == "spectral":
        grid = [
            (f"spectral (defaults: pruning {options.pruning}, merge {options.merge_cosine})", dict(method="spectral"))
        ]
    else:
        grid = [
            (f"spectral pruning {p:<4} merge {str(m):<4}", dict(method="spectral", pruning=p, merge_cosine=m))
            for p, m in itertools.product((0.05, 0.1, 0.2), (None, 0.6, 0.7, 0.8, 0.9))
        ]
        grid += [
            (f"ahc threshold {t:<3} merge {str(m):<4}", dict(method="ahc", threshold=t, merge_cosine=m))
            for t, m in itertools.product((0.3, 0.4, 0.5, 0.6, 0.7), (None, 0.8))
        ]
    best = None
    for name, settings in grid:
        hyp = {}
        for reco, d in done.items():
            pieces = subsegments(d.speech, options.window, options.hop)
            labels = cluster(d.embeddings, SpeakerCount(), seed=options.seed, **settings)
            hyp[reco] = labels_to_turns(pieces, labels)
        score = der(ref, hyp, uem, 0.25, False)
        right, error = count_agreement(ref, hyp)
        signed = sum(len({t.speaker for t in hyp[r]}) - len({t.speaker for t in ts}) for r, ts in ref.items()) / len(
            ref
        )
        print(
            f"{name} DER {100 * score['der']:6.2f} (conf {100 * score['confusion']:5.2f})  count {right}/{len(ref)} "
            f"|err| {error:.2f} mean err {signed:+.2f}",
            flush=True,
        )
        if best is None or (right, -score["der"]) > best[0]:
            best = ((right, -score["der"]), name, hyp)
    _, name, hyp = best
    by_count: dict = {}
    for reco, turns in ref.items():
        k = len({t.speaker for t in turns})
        got = len({t.speaker for t in hyp[reco]})
        by_count.setdefault(k, []).append(got)
    print(f"best by count: {name}: " + "; ".join(f"{k} speakers -> {v}" for k, v in sorted(by_count.items())))


if __name__ == "__main__":
    main()
