"""Clustering settings against DER on a set of conversations: each recording is embedded once (Silero VAD,
the default windows), then re-clustered for every setting; prints DER (collar 0.25, overlap scored) and how
many recordings got the reference's speaker count. For choosing defaults on conversations of the mini
corpus's validation speakers, not its test speakers (the figures of docs/diarization.md).

    speakerlab-synth-conversations --data egs/mini/data/val --out /tmp/valconv --num-conversations 10 \
        --noise egs/mini/data/musan/noise --seed 100
    OMP_NUM_THREADS=2 python bench/diarization_sweep.py --checkpoint egs/mini/exp/campplus --data /tmp/valconv
"""

from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path

from speakerlab.dataio.tables.lists import read_wav_scp
from speakerlab.dataio.tables.rttm import read_rttm, read_uem
from speakerlab.diarization import DiarizeOptions, Diarizer, SpeakerCount, make_vad
from speakerlab.diarization.cluster import cluster
from speakerlab.diarization.der import count_agreement, der
from speakerlab.diarization.pipeline import labels_to_turns, subsegments
from speakerlab.inference.embedder import load_embedder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--data", required=True, help="folder with wav.scp, rttm, uem")
    args = ap.parse_args()
    data = Path(args.data)
    ref, uem = read_rttm(data / "rttm"), read_uem(data / "uem")
    options = DiarizeOptions()
    diarizer = Diarizer(load_embedder(args.checkpoint, device="cpu"), make_vad("silero"), options)
    t0 = time.time()
    done = {reco: diarizer.diarize_file(path) for reco, (_, path) in read_wav_scp(data / "wav.scp").items()}
    print(f"embedded {len(done)} recordings in {time.time() - t0:.1f} s")
    grid = [("spectral", p, 0.5, m) for p, m in itertools.product((0.05, 0.1, 0.2), (None, 0.6, 0.7, 0.8, 0.9))]
    grid += [("ahc", 0.1, t, m) for t, m in itertools.product((0.3, 0.4, 0.5, 0.6, 0.7), (None, 0.8))]
    for method, pruning, threshold, merge in grid:
        hyp = {}
        for reco, d in done.items():
            pieces = subsegments(d.speech, options.window, options.hop)
            labels = cluster(d.embeddings, SpeakerCount(), method, options.seed, pruning, threshold, merge)
            hyp[reco] = labels_to_turns(pieces, labels)
        score = der(ref, hyp, uem, 0.25, False)
        right, error = count_agreement(ref, hyp)
        print(
            f"{method:<8} pruning {pruning:<4} threshold {threshold:<3} merge {str(merge):<4} "
            f"DER {100 * score['der']:6.2f} (conf {100 * score['confusion']:5.2f})  count {right}/{len(ref)} "
            f"|err| {error:.2f}"
        )


if __name__ == "__main__":
    main()
