"""How often two local speakers of one segmentation window are two different people: the premise of cannot-link
clustering (a window's local speakers never in one cluster), measured against the reference RTTM. Each (window,
local speaker) of the sweep's cache is given the reference speaker it overlaps most; a pair of one window is a
link, counted as right when those two speakers differ. Links are counted for all pairs of a window and for the
pairs active together on at least N frames (20 ms), i.e. what the model itself calls overlapped speech.

    OMP_NUM_THREADS=1 python bench/segmentation_links.py --checkpoint ../mini/exp/campplus --data data/valconv \\
        --segmentation exp/diar/segmentation/segmentation.onnx --cache /tmp/segcache    # in egs/mini_diar

The arguments and the cache are bench/segmentation_sweep.py's (a first run of either fills the cache).
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import numpy as np
from segmentation_sweep import front, load_models, model_arguments

from speakerlab.dataio.tables.lists import read_wav_scp
from speakerlab.dataio.tables.rttm import read_rttm
from speakerlab.diarization import DiarizeOptions


def majority_speaker(turns, intervals) -> str | None:
    """The reference speaker overlapping `intervals` [(start, end) s] longest, None where none does."""
    talk: dict = {}
    for start, end in intervals:
        for t in turns:
            shared = min(end, t.end) - max(start, t.start)
            if shared > 0:
                talk[t.speaker] = talk.get(t.speaker, 0.0) + shared
    return max(talk, key=talk.get) if talk else None


def links(local, found, min_frames: int) -> list:
    """Index pairs of `found` from one window, both active on at least `min_frames` common frames."""
    index = {(w, k): i for i, (w, k, _) in enumerate(found)}
    pairs = []
    for w in range(local.acts.shape[0]):
        slots = [k for k in range(local.acts.shape[2]) if (w, k) in index]
        for a, b in itertools.combinations(slots, 2):
            if int(np.sum(local.acts[w, :, a] * local.acts[w, :, b])) >= min_frames:
                pairs.append((index[(w, a)], index[(w, b)]))
    return pairs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    model_arguments(ap)
    ap.add_argument("--cache", required=True, help="bench/segmentation_sweep.py's cache")
    ap.add_argument("--min-frames", type=int, nargs="+", default=[0, 1, 10, 25, 50])
    args = ap.parse_args()
    data = Path(args.data)
    ref = read_rttm(data / "rttm")
    load_models(args)
    options = DiarizeOptions()
    done = {reco: front(args, options, reco, path, ref) for reco, (_, path) in read_wav_scp(data / "wav.scp").items()}
    for min_frames in args.min_frames:
        right = total = 0
        for reco, (local, found, _) in done.items():
            who = [majority_speaker(ref.get(reco, []), intervals) for _, _, intervals in found]
            for a, b in links(local, found, min_frames):
                total += 1
                right += who[a] != who[b]
        print(
            f"pairs of one window active together on >= {min_frames:>3} frames: {total:>6}, "
            f"two different people {100 * right / max(total, 1):5.1f} %",
            flush=True,
        )


if __name__ == "__main__":
    main()
