"""Every registered model exports to TorchScript and ONNX (dynamic time axis), checked against PyTorch."""

import pytest
import torch

from speakerlab.inference.export import check_export, export_onnx, export_torchscript
from speakerlab.models import build_model, builder_defaults, list_models
from tests.helpers import registry_params

# The fast lane exports ResNet34 at full size. The deep models export a shallow copy of themselves: the same class
# and blocks (each stage keeps its strided first block and at least one repeat), fewer repeats. What the export
# proves (every op translates, one file serves any length) is the blocks', not their count; full depth only makes
# it slower. CPU seconds to export and check, full vs this copy, one thread on a loaded 2-core machine: CAM++ 53 vs
# 12, Gemini DF-ResNet183 34 vs 7, ResNet221 41 vs 12. At full size each is built, scripted and run in test_models.py.
DEEP = {"num_blocks": (2, 2, 3, 2)}
EXPORT_ARGS = {
    "campplus": {"num_layers": (2, 2, 2)},
    "eres2net_base": DEEP,
    "eres2net_large": DEEP,
    "eres2netv2": DEEP,
    "gemini_dfresnet114": {"depths": (2, 2, 3, 2)},
    "gemini_dfresnet183": {"depths": (2, 2, 3, 2)},
    "resnet221": DEEP,
    "resnet293": DEEP,
}


@pytest.mark.parametrize("name", registry_params(list_models(), fast=("resnet34",)))
def test_onnx_export_matches_pytorch_at_two_lengths(name, tmp_path):
    """onnxruntime vs PyTorch at 200 and 317 frames: one file serves any length (dynamic time axis).
    (TorchScript of every model is checked in test_models.py.)"""
    torch.manual_seed(0)
    model = build_model(name, **EXPORT_ARGS.get(name, {})).eval()
    feat_dim = builder_defaults(name)["feat_dim"]
    export_onnx(model, tmp_path / "m.onnx", feat_dim)
    assert check_export(model, tmp_path / "m.onnx", "onnx", feat_dim, lengths=(200, 317), atol=1e-4) <= 1e-4


def test_torchscript_file_round_trip_and_wrong_file_caught(tmp_path):
    a = build_model("resnet34").eval()
    export_torchscript(a, tmp_path / "a.pt", 80)
    assert check_export(a, tmp_path / "a.pt", "torchscript", 80) == 0.0
    torch.manual_seed(1)
    b = build_model("resnet34").eval()
    with pytest.raises(RuntimeError, match="differs from PyTorch"):
        check_export(b, tmp_path / "a.pt", "torchscript", 80)
