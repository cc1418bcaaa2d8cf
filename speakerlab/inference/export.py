"""Export an embedding model to TorchScript or ONNX, with a dynamic batch and time axis.

    speakerlab-export --checkpoint exp/mini/checkpoints/avg.pt --format onnx --out campplus.onnx
    speakerlab-export --3dspeaker eres2net_base --weights pretrained.bin --format torchscript \
        --out m.pt

Both formats take the features of the model's front-end `(B, T, F)` (input name `feats`; Kaldi fbank, or the
ReDimNet2 log-mel, as the source's feature spec says, F its width, and the export line prints) and return
embeddings `(B, D)` (output name `embedding`); feature extraction stays outside, as in every
deployment runtime that has its own fbank. Models on a self-supervised encoder are not exported. After writing,
the file is loaded back and checked against PyTorch at two input lengths.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from speakerlab.commands import CommandParser


def export_torchscript(model: nn.Module, path, feat_dim: int) -> None:
    """Script the model over `(B, T, feat_dim)` features (trace as a fallback for models that script cannot
    compile) and save it."""
    model = model.eval()
    try:
        scripted = torch.jit.script(model)
    except Exception:  # some layers (e.g. checkpointing wrappers) only trace
        with torch.no_grad():
            scripted = torch.jit.trace(model, torch.randn(2, 200, feat_dim))
    scripted.save(str(path))


def export_onnx(model: nn.Module, path, feat_dim: int, opset: int = 18) -> None:
    """ONNX through torch.export over `(B, T, feat_dim)` features, batch and frame axes dynamic (any length >= 16
    frames)."""
    model = model.eval()
    # 537 frames: every size derived from time (e.g. CAM++ segments) is >= 2 and not a multiple of
    # anything, so torch.export does not specialise a size-1 or exactly-divisible axis.
    example = (torch.randn(2, 537, feat_dim),)
    batch, frames = torch.export.Dim("batch", min=1, max=4096), torch.export.Dim("frames", min=16, max=100000)
    arg = next(iter(_forward_arg_names(model)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            model,
            example,
            input_names=["feats"],
            output_names=["embedding"],
            dynamic_shapes={arg: {0: batch, 1: frames}},
            opset_version=opset,
            dynamo=True,
            external_data=False,
        )
    program.save(str(path))


def _forward_arg_names(model: nn.Module):
    import inspect

    return [p for p in inspect.signature(model.forward).parameters]


def check_export(model: nn.Module, path, fmt: str, feat_dim: int, lengths=(200, 317), atol: float = 1e-4) -> float:
    """Largest |exported - PyTorch| over two input lengths of `(2, T, feat_dim)`; raises when above `atol`."""
    worst = 0.0
    for frames in lengths:
        x = torch.randn(2, frames, feat_dim, generator=torch.Generator().manual_seed(frames))
        with torch.no_grad():
            ref = model.eval()(x).numpy()
        if fmt == "onnx":
            import onnxruntime as ort

            sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            got = sess.run(None, {"feats": x.numpy()})[0]
        else:
            # Without the profiling executor's optimisation passes: the first calls of a large
            # scripted graph would otherwise spend seconds re-optimising for each new shape.
            with torch.no_grad(), torch.jit.optimized_execution(False):
                got = torch.jit.load(str(path))(x).numpy()
        if got.shape != ref.shape:
            raise RuntimeError(f"{path}: output shape {got.shape} != {ref.shape} at {frames} frames")
        worst = max(worst, float(np.abs(got - ref).max()))
    if worst > atol:
        raise RuntimeError(f"{path}: exported model differs from PyTorch by {worst:.2e} (> {atol})")
    return worst


def main(argv=None) -> int:
    from speakerlab.frontends import FRONT_ENDS
    from speakerlab.inference.embedder import add_source_args, embedder_from_args

    ap = CommandParser(prog="speakerlab-export", description=__doc__.split("\n")[0])
    add_source_args(ap)
    ap.add_argument("--format", choices=["onnx", "torchscript"], required=True, help="what to write")
    ap.add_argument("--out", required=True, help="the exported file (.onnx or .pt)")
    args = ap.parse_args(argv)
    args.device = "cpu"  # exported graphs are traced on the CPU
    try:
        embedder = embedder_from_args(ap, args)
    except (ValueError, ImportError) as e:  # a SourceError names the file
        print(f"error: {e}", file=sys.stderr)
        return 2
    if FRONT_ENDS[embedder.spec.kind].encoder_input:
        print(
            f"error: export takes the fbank models over (B, T, F) features; this one is on a self-supervised "
            f"encoder ({embedder.spec.kind})",
            file=sys.stderr,
        )
        return 2
    model, feat_dim = embedder.model, embedder.spec.feat_dim
    if args.format == "onnx":
        import importlib.util

        missing = [m for m in ("onnx", "onnxscript", "onnxruntime") if importlib.util.find_spec(m) is None]
        if missing:  # recipes install requirements.txt only
            print(
                f"error: ONNX export needs {', '.join(missing)}: pip install -r requirements-test.txt", file=sys.stderr
            )
            return 2
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    (export_onnx if args.format == "onnx" else export_torchscript)(model, args.out, feat_dim)
    err = check_export(model, args.out, args.format, feat_dim=feat_dim)
    print(
        f"export: {args.out} ({args.format}; input: {embedder.spec.describe()}); "
        f"max |diff| vs PyTorch at 2 lengths: {err:.2e}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
