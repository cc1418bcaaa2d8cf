"""The official ReDimNet2 code's float64 embeddings of the fixture problem: tests/data/redimnet2/official_float64.json.

    python bench/redimnet2_float64.py --reference-root /path/to/redimnet2 [--reference-commit SHA]

The fixtures (tests/data/redimnet2/<size>.json) hold the official model's float32 embedding of a
filled, calibrated state dict. That problem is badly conditioned (the calibrated BatchNorms amplify
rounding): float32 runs of one implementation differ by several times the fixtures' 1e-3 tolerance
with the thread count. In float64 it is well posed, so this script builds the official
`ReDimNet2Wrap` of every fixture (bench/models.py's isolated import, the `spec` front-end replaced by
a transpose), loads the filled state dict (float32 values, as the fill rule ends) with strict=True,
converts model and input to float64, calibrates as the fixtures' README says, and writes the
eval-mode embeddings. tests/test_redimnet2.py compares our float64 model with them. Nothing of the
reference code is stored, only its outputs, with this command and the reference's commit.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import shlex
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import models as bm  # noqa: E402  (bench/models.py: reference import machinery; puts the root on sys.path)

from tests.fixture_models import calibrate, fill_state_dict, make_input  # noqa: E402

OUT = bm.REDIMNET2_FIXTURES / "official_float64.json"
SIZES = sorted(p.stem for p in bm.REDIMNET2_FIXTURES.glob("b*.json"))


def official_float64_embedding(size: str, fixture: dict, roots: dict, override: dict | None = None) -> list:
    """The official model's `(4, 192)` float64 embedding for fixture `size` (its loaded JSON), as nested
    lists; `override` changes constructor settings (the fixtures' `embedding_alternative`)."""
    ref = bm.redimnet2_reference(size)
    if override:
        ref = dataclasses.replace(ref, fixture=None, kwargs={**fixture["reference_kwargs"], **override})
    model, _ = bm.build_reference(ref, roots)
    model.load_state_dict(fill_state_dict(fixture["state_dict"]), strict=True)
    model = model.double()
    shape = fixture["input"]
    x = make_input(shape["batch"], shape["frames"], shape["mels"]).double()  # (B, T, 72), float32 values
    calibrate(model, x)
    with torch.no_grad():
        return model(x).tolist()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reference-root", type=Path, required=True, help="a checkout of PalabraAI/redimnet2")
    ap.add_argument("--reference-commit", default="not given", help="the checkout's commit, recorded as given")
    ap.add_argument("--sizes", nargs="+", default=SIZES, choices=SIZES)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    try:
        roots = bm.check_reference_roots([args.reference_root])
    except bm.ReferenceError_ as e:
        ap.error(str(e))
    if "ReDimNet2" not in roots:
        ap.error(f"--reference-root {args.reference_root} is not a checkout of the official ReDimNet2 code")
    command = "python bench/redimnet2_float64.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    print(f"# command: {command}", flush=True)
    result = {
        "what": "official ReDimNet2Wrap (spec replaced by a transpose) in float64: fixture fill rule (float32 values), "
        "fixture input (float32 values), BatchNorm calibration in float64, eval-mode embedding (4, 192)",
        "command": command,
        "reference_commit": args.reference_commit,
        "torch": torch.__version__,
        "machine": platform.machine(),
        "embeddings": {},
        "alternative": {},  # the fixtures' `embedding_alternative` settings
    }
    for size in args.sizes:
        fixture = json.loads((bm.REDIMNET2_FIXTURES / f"{size}.json").read_text())
        result["embeddings"][size] = official_float64_embedding(size, fixture, roots)
        alternative = fixture.get("embedding_alternative")
        if alternative:
            override = alternative["reference_kwargs_override"]
            result["alternative"][size] = {
                "reference_kwargs_override": override,
                "embedding": official_float64_embedding(size, fixture, roots, override),
            }
        print(f"{size}: done", flush=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
