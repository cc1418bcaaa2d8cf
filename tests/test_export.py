"""Every registered model exports to TorchScript and ONNX (dynamic time axis), checked against PyTorch."""

import pytest
import torch

from speakerlab.inference.export import check_export, export_onnx, export_torchscript
from speakerlab.models import build_model, builder_defaults, list_models
from tests.helpers import export_copy, registry_params

# The fast lane exports ResNet34 at full size, the deep models a shallow copy (tests/helpers.py export_copy).


@pytest.mark.parametrize("name", registry_params(list_models(), fast=("resnet34",)))
def test_onnx_export_matches_pytorch_at_two_lengths(name, tmp_path):
    """onnxruntime vs PyTorch at 200 and 317 frames: one file serves any length (dynamic time axis).
    (TorchScript of every model is checked in test_models.py.)"""
    torch.manual_seed(0)
    model = export_copy(name).eval()
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


@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
def test_an_export_that_disagrees_with_pytorch_is_one_line_and_not_written(fmt, tmp_path, monkeypatch, capsys):
    """An exporter that writes a slightly different model (standing in for a converter bug, 3D-Speaker#139): the
    command's check catches it, exit 1 with one line, and neither the file nor its unchecked temporary is left."""
    import copy

    from speakerlab.inference import export
    from tests.helpers import ROOT

    name = "export_onnx" if fmt == "onnx" else "export_torchscript"
    real = getattr(export, name)

    def wrong(model, path, feat_dim):
        other = copy.deepcopy(model)
        with torch.no_grad():
            next(other.parameters()).add_(0.5)
        return real(other, path, feat_dim)

    monkeypatch.setattr(export, name, wrong)
    out = tmp_path / f"m.{'onnx' if fmt == 'onnx' else 'pt'}"
    tiny = ROOT / "tests" / "data" / "legacy_checkpoint" / "campplus_tiny.pt"
    assert export.main(["--checkpoint", str(tiny), "--format", fmt, "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {out} not written: the exported model differs from PyTorch")
    assert list(tmp_path.iterdir()) == []
