"""bench/models.py's reference handling, on tiny fake checkouts laid out like 3D-Speaker and PalabraAI/redimnet2.

Nothing of the real reference code is used: each fake root holds a few lines with the real module and class
names. Our models are replaced by a tiny one in `main`, so the whole file runs in seconds.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

BENCH = Path(__file__).resolve().parent.parent / "bench" / "models.py"

FAKE_3DSPEAKER = {
    "speakerlab/__init__.py": "",
    "speakerlab/models/__init__.py": "",
    "speakerlab/models/campplus/__init__.py": "",
    "speakerlab/models/campplus/DTDNN.py": """
import torch.nn as nn

class CAMPPlus(nn.Module):
    def __init__(self, feat_dim, embedding_size, memory_efficient=True):  # the 3D-Speaker signature
        super().__init__()
        self.linear = nn.Linear(feat_dim, embedding_size)

    def forward(self, x):  # (B, T, feat_dim) like ours
        return self.linear(x).mean(dim=1)
""",
}

FAKE_REDIMNET2 = {
    "redimnet2/__init__.py": "",
    "redimnet2/redimnet2.py": """
import torch.nn as nn
import torchaudio  # at module level, as the official code does

class ReDimNet2Wrap(nn.Module):
    def __init__(self, F=72, C=24, embed_dim=192, **settings):
        super().__init__()
        print("out_channels : None")  # the official constructor prints
        self.F = F
        self.spec = nn.Identity()  # stands for the waveform front-end
        self.linear = nn.Linear(F, embed_dim)

    def forward(self, x):
        x = self.spec(x)
        assert x.shape[1] == self.F, "the body takes (B, F, T) log-mel"
        return self.linear(x.mean(dim=2))
""",
}


def write_tree(root: Path, files: dict) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.fixture(scope="module")
def bm():
    spec = importlib.util.spec_from_file_location("bench_models_under_test", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


@pytest.fixture
def roots(tmp_path):
    return (
        write_tree(tmp_path / "3D-Speaker", FAKE_3DSPEAKER),
        write_tree(tmp_path / "redimnet2", FAKE_REDIMNET2),
    )


class Tiny(nn.Module):
    def __init__(self, feat_dim):
        super().__init__()
        self.linear = nn.Linear(feat_dim, 8)

    def forward(self, x):
        return self.linear(x).mean(dim=1)


def run_main(bm, monkeypatch, capsys, *argv):
    """bench/models.py's main with our models replaced by `Tiny`; (exit code, stdout lines)."""
    monkeypatch.setattr(bm, "build_model", lambda name: Tiny(bm.model_feat_dim(name)))
    code = bm.main(["--repeats", "1", "--threads", "1", "--no-gpu", *argv])
    return code, capsys.readouterr().out.splitlines()


def row(lines, name):
    (line,) = [line for line in lines if line.startswith(name + " ")]
    return line.split()


def test_roots_are_recognised_by_layout(bm, roots, tmp_path):
    three_d, redim = roots
    found = bm.check_reference_roots([redim, three_d])
    assert found == {"ReDimNet2": redim.resolve(), "3D-Speaker": three_d.resolve()}
    (tmp_path / "neither").mkdir()
    with pytest.raises(bm.ReferenceError_, match="neither: none of the known layouts"):
        bm.check_reference_roots([tmp_path / "neither"])
    with pytest.raises(bm.ReferenceError_, match="both ReDimNet2 checkouts"):
        bm.check_reference_roots([redim, redim])


def test_unknown_root_is_a_usage_error_naming_it(bm, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        bm.main(["--models", "campplus", "--reference-root", str(tmp_path)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"--reference-root {tmp_path.resolve()}" in err and "redimnet2/redimnet2.py" in err


def test_reference_import_is_isolated(bm, roots):
    three_d, redim = roots
    found = bm.check_reference_roots(roots)
    ours = sys.modules["speakerlab"]
    torchaudio_before = sys.modules.get("torchaudio")
    campplus, note = bm.reference_model("campplus", found)
    assert type(campplus).__name__ == "CAMPPlus" and str(three_d) in note
    assert sys.modules["speakerlab"] is ours and not any(k.startswith("redimnet2") for k in sys.modules)
    model, note = bm.reference_model("redimnet2_b0", found)
    assert "b0.json" in note and "transpose" in note
    assert model.F == 72 and isinstance(model.spec, bm._MelMajor)
    assert model(torch.randn(2, 20, 72)).shape == (2, 192)  # our (B, T, F) input
    assert not any(k == "redimnet2" or k.startswith("redimnet2.") for k in sys.modules)
    assert sys.modules.get("torchaudio") is torchaudio_before
    assert bm.reference_model("ecapa_tdnn_c512", found)[0] is None


def test_table_has_reference_time_and_ratio(bm, roots, monkeypatch, capsys):
    code, lines = run_main(
        bm, monkeypatch, capsys, "--models", "redimnet2_b0", "campplus", "--reference-root", str(roots[1])
    )
    assert code == 0
    assert lines[0].startswith("# command: python bench/models.py --repeats 1")
    assert "reference s" in lines[3] and "ours/ref" in lines[3]
    b0 = row(lines, "redimnet2_b0")
    assert len(b0) == 6 and float(b0[4]) >= 0 and float(b0[5]) > 0  # reference seconds, ours/reference
    assert row(lines, "campplus")[-2:] == ["n/a", "-"]
    assert any(line.startswith("# reference redimnet2_b0: redimnet2.redimnet2.ReDimNet2Wrap(") for line in lines)
    assert any("no --reference-root of a 3D-Speaker checkout" in line for line in lines)
    assert not any(line.startswith("out_channels") for line in lines)  # the constructor's print is swallowed


def test_failing_reference_says_failed_and_why(bm, roots, monkeypatch, capsys):
    three_d, redim = roots
    torchaudio_before = sys.modules.get("torchaudio")
    (redim / "redimnet2" / "redimnet2.py").write_text(
        "import torchaudio\n\nclass ReDimNet2Wrap:\n"
        "    def __init__(self, **kwargs):\n        torchaudio.no_such_transform_for_the_test\n"
    )
    (three_d / "speakerlab" / "models" / "campplus" / "DTDNN.py").unlink()
    argv = ["--models", "redimnet2_b1", "campplus", "--reference-root", str(redim), "--reference-root", str(three_d)]
    code, lines = run_main(bm, monkeypatch, capsys, *argv)
    assert code == 1
    assert row(lines, "redimnet2_b1")[-2:] == ["failed", "-"] and row(lines, "campplus")[-2:] == ["failed", "-"]
    assert any(
        line.startswith("# reference redimnet2_b1: failed:") and "AttributeError" in line and "b1.json" in line
        for line in lines
    )
    assert any(line.startswith("# reference campplus: failed:") and "ModuleNotFoundError" in line for line in lines)
    assert sys.modules.get("torchaudio") is torchaudio_before


# A stand-in for the official ReDimNet2Wrap built from our own model, so the real state-dict layout loads.
OURS_AS_REDIMNET2 = """
import torch.nn as nn
from speakerlab.models.redimnet2 import ReDimNet2, redimnet2_kwargs

class ReDimNet2Wrap(ReDimNet2):
    def __init__(self, **settings):
        super().__init__(**redimnet2_kwargs(settings))
        self.spec = nn.Identity()

    def forward(self, x):  # (B, 72, T) after the front-end, as the official body takes it
        return super().forward(self.spec(x).transpose(1, 2))
"""


def test_float64_reference_script_writes_the_official_embedding(tmp_path, capsys):
    """bench/redimnet2_float64.py: fill rule, strict load, float64 calibration, output layout."""
    from tests.fixture_models import calibrated_embedding

    redim = write_tree(
        tmp_path / "redimnet2", {"redimnet2/__init__.py": "", "redimnet2/redimnet2.py": OURS_AS_REDIMNET2}
    )
    path = BENCH.parent / "redimnet2_float64.py"
    spec = importlib.util.spec_from_file_location("redimnet2_float64_under_test", path)
    script = importlib.util.module_from_spec(spec)
    had_models = "models" in sys.modules
    try:
        spec.loader.exec_module(script)
        out = tmp_path / "official_float64.json"
        argv = ["--reference-root", str(redim), "--sizes", "b1", "--out", str(out)]
        assert script.main(argv) == 0
    finally:
        if not had_models:
            sys.modules.pop("models", None)  # the script imports bench/models.py under that name
    assert capsys.readouterr().out.startswith("# command: python bench/redimnet2_float64.py --reference-root ")
    written = json.loads(out.read_text())
    assert written["reference_commit"] == "not given" and sorted(written["embeddings"]) == ["b1"]
    expected = calibrated_embedding("b1", dtype=torch.float64)
    torch.testing.assert_close(torch.tensor(written["embeddings"]["b1"], dtype=torch.float64), expected)
    alternative = written["alternative"]["b1"]
    assert alternative["reference_kwargs_override"] == {"return_2d_output": False}
    expected = calibrated_embedding("b1", return_2d_output=False, dtype=torch.float64)
    torch.testing.assert_close(torch.tensor(alternative["embedding"], dtype=torch.float64), expected)
