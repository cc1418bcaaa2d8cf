"""bench/gpu_session.sh, the first command of a GPU session: its dry run on the CPU (so it cannot rot)
and the figures it rests on (peak table, MFU inputs, the quoted command)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.train_step import peak_tflops, without_deadline  # noqa: E402
from tests.fake_corpora import recipe_env  # noqa: E402
from tests.helpers import assert_no_traceback  # noqa: E402


@pytest.mark.parametrize(
    "name, precision, peak",
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4),  # the SXM part's name
        ("NVIDIA H100 80GB HBM3", "tf32", 494.7),
        ("NVIDIA H100 80GB HBM3", "fp32", 66.9),
        ("NVIDIA H100 PCIe", "bf16", 756.0),
        ("NVIDIA H100 PCIe", "tf32", 378.0),
        ("NVIDIA H100 NVL", "bf16", 835.5),
        ("NVIDIA H100 NVL", "fp32", 60.0),
        ("NVIDIA H200", "bf16", 989.4),
        ("NVIDIA A100-SXM4-80GB", "tf32", 156.0),
        ("NVIDIA GeForce RTX 4090", "bf16", None),
    ],
)
def test_peak_table_tells_the_h100_variants_apart(name, precision, peak):
    assert peak_tflops(name, precision) == peak


def test_the_quoted_command_leaves_out_the_session_specific_arguments():
    argv = ["--models", "campplus", "--deadline", "1795427182", "--json", "/tmp/x.json", "--batches", "256"]
    assert without_deadline(argv) == ["--models", "campplus", "--batches", "256"]


@pytest.mark.slow
def test_the_dry_run_runs_every_step_on_the_cpu(tmp_path):
    out = tmp_path / "gs"
    r = subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_session.sh"), "--dry-run", "--out", str(out)],
        env=recipe_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    logs = [(out / name).read_text() for name in ("env.txt", "test_cuda.txt", "measure.txt")]
    assert_no_traceback(r.stdout, r.stderr, *logs)
    rows = (out / "rows.md").read_text().splitlines()
    assert len(rows) == 8  # 2 models x (2 eager precisions + bf16 loader eager + bf16 compiled)
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 10 and cells[0] in ("campplus", "eres2net_base") and float(cells[4]) >= 0
        assert cells[9].startswith("`python bench/train_step.py") and "--deadline" not in cells[9]
    assert {r["pipeline"] for f in out.glob("train_*.json") for r in json.loads(f.read_text()) if "pipeline" in r} == {
        "synthetic",
        "loader",
    }
    probe = json.loads((out / "train_probe.json").read_text())
    assert [p["chosen"] for p in probe] == [8, 8]
    extract = json.loads((out / "extract.json").read_text())
    assert [e["rc"] for e in extract] == [0, 0] and all(e["utt_per_s"] > 0 for e in extract)
    assert "15 skipped" in logs[1]  # tests/test_cuda.py ran (and skipped here: no CUDA)


def test_a_budget_that_is_not_whole_seconds_is_one_error_before_any_set_up(tmp_path):
    r = subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_session.sh"), "--budget", "5m", "--out", str(tmp_path / "gs")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert r.stderr.strip() == "error: --budget takes whole seconds, got 5m"
    assert not (tmp_path / "gs").exists()
