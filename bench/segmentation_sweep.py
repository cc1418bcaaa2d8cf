"""Settings of the segmentation way of diarizing against DER on a set of conversations: each recording is
segmented and embedded once (per (window, local speaker), speakerlab.diarization.segmented), then re-clustered
for every setting; prints DER (collar 0.25, overlap scored), missed overlapped speech and how many recordings got
the reference's speaker count. For choosing defaults on conversations of the validation speakers, never the
held-out ones (bench/RESULTS.md, the segmentation model).

    OMP_NUM_THREADS=1 python bench/segmentation_sweep.py --checkpoint egs/mini/exp/campplus \\
        --data egs/mini_diar/data/valconv --segmentation exp/diar/segmentation/segmentation.onnx \\
        --plda exp/diar/plda.npz --cache /tmp/segcache \\
        --setting spectral method=spectral --setting vbx method=vbx --setting vbx0 method=vbx,loop_p=0

`--segmentation reference` takes each window's local speakers from the reference RTTM instead of a model (what the
embeddings, clustering and reconstruction give with a perfect segmenter); a `segmentation.pt` runs the model in
torch (the ONNX file gives the same frame scores within 1e-4, tests/test_segmentation.py). A setting is `NAME
KEY=VALUE,...` over speakerlab.diarization.pipeline.DiarizeOptions' fields; `--vbx-grid` adds every combination of
`--fa`, `--fb`, `--loop-p`, `--init-threshold` (VBx). `--cache DIR` keeps each recording's local speakers and
embeddings (per segmentation file and options) for the next run. `--oracle-count` gives each recording its true
count.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
import pickle
import time
from pathlib import Path

import numpy as np

from speakerlab.dataio.audio import read_audio
from speakerlab.dataio.tables.lists import read_wav_scp
from speakerlab.dataio.tables.rttm import Turn, read_rttm, read_uem
from speakerlab.diarization import DiarizeOptions, SpeakerCount
from speakerlab.diarization.clustering.plda import load_plda
from speakerlab.diarization.der import count_agreement, der, overlap_missed
from speakerlab.diarization.pipeline import speaker_name
from speakerlab.diarization.segmented import LocalSpeakers, clustered, gather, local_speakers, speaker_spans
from speakerlab.diarization.segmenter import window_layout


def reference_local(turns, num_samples: int, rate: int, options: DiarizeOptions) -> LocalSpeakers:
    """The reference's local speakers of the windows the segmenter would see (its frame layout)."""
    from speakerlab.diarization.segmentation import HOP, KERNEL, STRIDE, SegmentationModel, frame_labels

    hop = HOP * STRIDE
    size, stride, count = window_layout(num_samples, options.seg_window, options.seg_step, rate, KERNEL, hop)
    frames = SegmentationModel.num_frames(size)
    spans = [(t.start, t.end, t.speaker) for t in turns]
    acts = np.stack([frame_labels(spans, frames, offset=w * stride / rate) for w in range(count)])
    return LocalSpeakers(acts, stride // hop, hop / rate, KERNEL / 2 / rate, num_samples / rate)


class TorchSegmenter:
    """A segmentation.pt run in torch with OnnxSegmenter's interface (the part speakerlab.diarization.segmented
    uses): `sample_rate`, `hop`, `frame_centres`, `sliding`."""

    def __init__(self, path: str):
        import torch

        from speakerlab.diarization.segmentation import (
            HOP,
            KERNEL,
            SAMPLE_RATE,
            STRIDE,
            SegmentationModel,
            SegmentationShape,
            powerset_matrix,
        )

        saved = torch.load(path)
        self.model = SegmentationModel(SegmentationShape(**saved["shape"])).eval()
        self.model.load_state_dict(saved["state"])
        self.sample_rate, self.kernel, self.hop = SAMPLE_RATE, KERNEL, HOP * STRIDE
        self.powerset = powerset_matrix().numpy()

    def frame_centres(self, num_frames: int) -> np.ndarray:
        return (np.arange(num_frames) * self.hop + self.kernel / 2) / self.sample_rate

    def sliding(self, wave: np.ndarray, window: float, step: float, batch: int = 32):
        import torch

        size, stride, count = window_layout(len(wave), window, step, self.sample_rate, self.kernel, self.hop)
        padded = np.zeros((count - 1) * stride + size, np.float32)
        padded[: len(wave)] = wave
        out = []
        with torch.no_grad():
            for first in range(0, count, batch):
                starts = range(first * stride, min(first + batch, count) * stride, stride)
                logits = self.model(torch.from_numpy(np.stack([padded[a : a + size] for a in starts])))
                out.append(self.powerset[logits.argmax(-1).numpy()])
        return np.concatenate(out), stride // self.hop


def load_models(args) -> None:
    """`args.embedder` from `args.checkpoint`, `args.segmenter` from `args.segmentation` (None: the reference's local
    speakers; a `.pt` file in torch; else the ONNX file): what `front` runs on a recording not in the cache."""
    from speakerlab.inference.embedder import load_embedder

    args.embedder = load_embedder(args.checkpoint, device="cpu")
    if args.segmentation == "reference":
        args.segmenter = None
    elif args.segmentation.endswith(".pt"):
        args.segmenter = TorchSegmenter(args.segmentation)
    else:
        from speakerlab.diarization.segmenter import OnnxSegmenter

        args.segmenter = OnnxSegmenter(args.segmentation, threads=1)


def front(args, options: DiarizeOptions, reco: str, path: str, ref) -> tuple:
    """(LocalSpeakers, speaker spans, embeddings) of one recording, from the cache when a run before made them."""
    key = f"{args.segmentation}|{Path(args.segmentation).stat().st_mtime if args.segmentation != 'reference' else ''}"
    key += f"|{args.checkpoint}|{options.seg_window}|{options.seg_step}|{options.min_embed}|{path}"
    cached = Path(args.cache) / (hashlib.sha1(key.encode()).hexdigest() + ".pkl") if args.cache else None
    if cached is not None and cached.is_file():
        return pickle.loads(cached.read_bytes())
    embedder, segmenter = args.embedder, args.segmenter
    wave = read_audio(path)
    rate = embedder.sample_rate
    if segmenter is None:
        local = reference_local(ref.get(reco, []), len(wave), rate, options)
    else:
        local, _ = local_speakers(segmenter, wave, rate, options.seg_window, options.seg_step)
    found = speaker_spans(local, options.min_embed)
    need = max(int(round(options.min_embed * rate)), embedder.min_samples)
    waves = [gather(wave, rate, s, need) for _, _, s in found]
    emb = embedder.embed_waves(waves, max_batch=options.batch_size) if waves else np.zeros((0, 0), np.float32)
    out = (local, found, emb)
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_bytes(pickle.dumps(out))
    return out


def settings_of(args) -> list:
    """[(name, DiarizeOptions overrides)] of --setting and --vbx-grid."""
    out = []
    fields = {f.name: f.type for f in dataclasses.fields(DiarizeOptions)}
    for name, spec in args.setting:
        over = {}
        for item in filter(None, spec.split(",")):
            key, value = item.split("=", 1)
            if key not in fields:
                raise SystemExit(f"unknown setting {key!r}: one of {', '.join(fields)}")
            over[key] = None if value == "None" else value if key == "method" else float(value)
        out.append((name, over))
    if args.vbx_grid:
        for fa, fb, lp, it in itertools.product(args.fa, args.fb, args.loop_p, args.init_threshold):
            over = dict(method="vbx", fa=fa, fb=fb, loop_p=lp, vbx_init=it)
            out.append((f"vbx fa {fa:<5} fb {fb:<5} loop_p {lp:<4} init {it:<4}", over))
    return out


def model_arguments(ap: argparse.ArgumentParser) -> None:
    """The options `load_models` and `front` read (bench/segmentation_links.py takes them too)."""
    ap.add_argument("--checkpoint", required=True, help="the embedder (a checkpoint or exp dir)")
    ap.add_argument("--data", required=True, help="folder with wav.scp, rttm, uem")
    ap.add_argument("--segmentation", required=True, help="the segmentation model's ONNX file, or 'reference'")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    model_arguments(ap)
    ap.add_argument("--plda", help="the PLDA of the embedder (vbx settings)")
    ap.add_argument("--cache", help="keep and reuse each recording's local speakers and embeddings here")
    ap.add_argument("--oracle-count", action="store_true", help="give each recording its reference count")
    ap.add_argument("--setting", nargs=2, action="append", default=[], metavar=("NAME", "KEY=VALUE,..."))
    ap.add_argument("--by-count", action="store_true", help="also each setting's counts found, by true count")
    ap.add_argument("--vbx-grid", action="store_true", help="also every combination of the four lists below")
    ap.add_argument("--fa", type=float, nargs="+", default=[0.3])
    ap.add_argument("--fb", type=float, nargs="+", default=[2.0])
    ap.add_argument("--loop-p", type=float, nargs="+", default=[0.5])
    ap.add_argument("--init-threshold", type=float, nargs="+", default=[0.6])
    args = ap.parse_args()
    data = Path(args.data)
    ref, uem = read_rttm(data / "rttm"), read_uem(data / "uem")
    plda = load_plda(args.plda) if args.plda else None
    base = DiarizeOptions()
    load_models(args)
    t0 = time.time()
    scp = read_wav_scp(data / "wav.scp")
    done = {reco: front(args, base, reco, path, ref) for reco, (_, path) in scp.items()}
    print(f"segmented and embedded {len(done)} recordings in {time.time() - t0:.1f} s", flush=True)
    for name, over in settings_of(args) or [("defaults", {})]:
        options = dataclasses.replace(base, **over)
        hyp, t0 = {}, time.time()
        for reco, (local, found, emb) in done.items():
            true = len({t.speaker for t in ref.get(reco, [])})
            count = SpeakerCount.exactly(true) if args.oracle_count else SpeakerCount()
            parts = clustered(local, found, emb, count, options, plda)
            hyp[reco] = [Turn(s, e, speaker_name(k)) for s, e, k in parts["turns"]]
        score = der(ref, hyp, uem, 0.25, False)
        missed, _ = overlap_missed(ref, hyp, uem, 0.25)
        right, error = count_agreement(ref, hyp)
        diff = [len({t.speaker for t in hyp[r]}) - len({t.speaker for t in ts}) for r, ts in ref.items()]
        print(
            f"{name:<44} DER {100 * score['der']:6.2f} (miss {100 * score['missed detection']:5.2f} fa "
            f"{100 * score['false alarm']:5.2f} conf {100 * score['confusion']:5.2f}) overl.miss {100 * missed:5.2f} "
            f"count {right}/{len(ref)} under {sum(d < 0 for d in diff)} over {sum(d > 0 for d in diff)} "
            f"({time.time() - t0:.1f} s)",
            flush=True,
        )
        if args.by_count:
            found: dict = {}
            for r, ts in sorted(ref.items()):
                found.setdefault(len({t.speaker for t in ts}), []).append(len({t.speaker for t in hyp[r]}))
            print("    found, by true count: " + "; ".join(f"{k}: {v}" for k, v in sorted(found.items())), flush=True)


if __name__ == "__main__":
    main()
