"""No-training baseline of a test set: cosine of per-utterance mean log-mel (80 bins, no normalisation).

    speakerlab-baseline --data data/test --out exp/mini/scores/test_baseline

It tells how hard a corpus is before any model is trained: a trained model should beat it by far.
Writes `<out>.result` and prints the EER and minDCF.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from speakerlab.commands import CommandParser
from speakerlab.devices import resolve_device
from speakerlab.frontends import FbankConfig, FeatureSpec
from speakerlab.inference.embedder import Embedder
from speakerlab.inference.extract import embed_data_dir
from speakerlab.outputs import write_text
from speakerlab.scoring.scorer import evaluate


class MeanOverTime(torch.nn.Module):
    """`(B, T, F) -> (B, F)`: the "model" of the baseline."""

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        return feats.mean(dim=1)


def main(argv=None) -> int:
    ap = CommandParser(prog="speakerlab-baseline", description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="data dir with wav.scp and trials")
    ap.add_argument("--out", required=True, help="output prefix: <out>.result")
    ap.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N, mps")
    args = ap.parse_args(argv)
    embedder = Embedder(
        MeanOverTime(),
        FeatureSpec(FbankConfig(dither=0.0), mean_norm=False),
        resolve_device(args.device),
        "mean log-mel",
    )
    ids, emb = embed_data_dir(embedder, args.data)
    trials = Path(args.data) / "trials"
    _, labels, eer, dcf = evaluate(ids, emb, trials)
    result = (
        f"{trials}: mean log-mel baseline, {len(labels)} trials: EER {eer * 100:.2f}% minDCF(p_target=0.01) {dcf:.4f}"
    )
    write_text(f"{args.out}.result", result + "\n")
    print(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
