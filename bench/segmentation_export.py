"""Seconds to write the segmentation model's ONNX file, the way speakerlab-segmentation-train does
(speakerlab.diarization.segmentation.export_onnx: torch's TorchScript-based exporter) against torch.export (the
embedders' path, speakerlab.inference.deploy.graph.torch_to_onnx), on a model of a config's shape (random weights:
the export does not depend on them), and how far each file is from torch.

    OMP_NUM_THREADS=1 python bench/segmentation_export.py [--config conf/diarization/segmentation_cpu.yaml]
        [--skip-torch-export]

Each export runs in a process of its own (a second torch.export of an LSTM in one process fixes the length axis).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.scoring import machine  # noqa: E402

CHILD = r"""
import sys, time
import numpy as np, onnxruntime as ort, torch, yaml
from speakerlab.diarization.segmentation import KERNEL, STRIDE, HOP, SegmentationModel, SegmentationShape, export_onnx
from speakerlab.inference.deploy.graph import torch_to_onnx

config, way, path = sys.argv[1:4]
raw = yaml.safe_load(open(config))
keys = {k: raw[k] for k in ("filters", "channels", "hidden", "layers", "frontend", "dropout") if k in raw}
torch.manual_seed(0)
model = SegmentationModel(SegmentationShape(**keys)).eval()
began = time.perf_counter()
if way == "torchscript":
    export_onnx(model, path)
else:
    graph = torch_to_onnx(model, torch.randn(2, 40123), ("wave", "scores"), min_length=KERNEL + STRIDE * HOP)
    open(path, "wb").write(graph.SerializeToString())
seconds = time.perf_counter() - began
session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
worst = 0.0
for batch, samples in ((1, 16000), (3, 80017)):
    x = torch.randn(batch, samples) * 0.1
    with torch.no_grad():
        want = model(x).numpy()
    worst = max(worst, float(np.abs(session.run(None, {"wave": x.numpy()})[0] - want).max()))
print(f"{way}: {seconds:.2f} s, max |onnx - torch| {worst:.2e} over batches 1 and 3 (1 s, 5 s)")
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="conf/diarization/segmentation_cpu.yaml")
    ap.add_argument("--skip-torch-export", action="store_true", help="time the command's exporter only")
    args = ap.parse_args(argv)
    print(f"# {' '.join([sys.executable.rsplit('/', 1)[-1], *sys.argv])}")
    print(f"# {machine()}, {time.ctime()}")
    print(f"# OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, config {args.config}")
    ways = ["torchscript"] + ([] if args.skip_torch_export else ["torch.export"])
    with tempfile.TemporaryDirectory() as tmp:
        for way in ways:
            path = os.path.join(tmp, f"{way}.onnx")
            subprocess.run([sys.executable, "-c", CHILD, args.config, way, path], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
