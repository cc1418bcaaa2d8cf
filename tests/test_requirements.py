"""The requirements files and pyproject.toml's dependency lists say the same thing.

pip reads `requirements*.txt` (egs/tools/env.sh, tests/run.sh) and `pyproject.toml` (`pip install -e .[extra]`):
two spellings of one list. pyproject.toml is the source; each requirements file must hold exactly its lists
(its `-r` includes followed), so an edit to one that forgets the other fails here, naming the file.
"""

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="tomllib is Python >= 3.11 (the project supports 3.10)")

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS = PROJECT["optional-dependencies"]


def own_lines(path: Path) -> set[str]:
    """The requirement specifiers a requirements file adds itself (comments, blanks and `-r` includes left out)."""
    specs = set()
    for line in path.read_text().splitlines():
        spec = line.split("#", 1)[0].strip()
        if spec and not spec.startswith("-r"):
            specs.add(spec.replace(" ", ""))
    return specs


def includes(path: Path) -> set[Path]:
    return {
        (path.parent / line.split()[1]).resolve() for line in path.read_text().splitlines() if line.startswith("-r")
    }


@pytest.mark.parametrize(
    "path, lists",
    [
        ("requirements.txt", ["dependencies"]),
        ("egs/tools/requirements-diarization.txt", ["diarization"]),
        ("egs/tools/requirements-selfsup.txt", ["selfsup"]),
        ("requirements-test.txt", ["test", "ssl"]),
    ],
)
def test_each_requirements_file_holds_exactly_pyprojects_lists(path, lists):
    expected = set()
    for name in lists:
        expected |= set(PROJECT["dependencies"] if name == "dependencies" else EXTRAS[name])
    got = own_lines(ROOT / path)
    assert got == expected, (
        f"{path}: only here {sorted(got - expected)}, only in pyproject.toml {sorted(expected - got)}"
    )


def test_the_test_requirements_include_the_runtime_diarization_and_selfsup_lists():
    # The suite runs every layer: the test file pulls the plain and diarization files in, pyproject's [test] extra is
    # used with them (pip install -e .[test,ssl,diarization]).
    assert includes(ROOT / "requirements-test.txt") == {
        (ROOT / "requirements.txt").resolve(),
        (ROOT / "egs/tools/requirements-diarization.txt").resolve(),
        (ROOT / "egs/tools/requirements-selfsup.txt").resolve(),
    }
    for extra in ("diarization", "selfsup"):
        assert includes(ROOT / f"egs/tools/requirements-{extra}.txt") == {(ROOT / "requirements.txt").resolve()}


def test_the_diarization_layer_imports_only_what_its_lists_install():
    """Every package a module of speakerlab/diarization imports (at the top or inside a function) is installed by
    requirements.txt or the diarization list: a fresh egs/mini_diar venv once trained its segmentation model for 20
    minutes and then failed on `import onnx`, which only the test list held."""
    import ast
    import re
    import sys
    from importlib.metadata import packages_distributions

    def name(spec: str) -> str:
        return re.split(r"[<>=!~;\[ ]", spec, maxsplit=1)[0].lower().replace("_", "-").replace(".", "-")

    installed = {name(spec) for spec in PROJECT["dependencies"] + EXTRAS["diarization"]}
    provided = packages_distributions()
    missing = []
    for path in sorted((ROOT / "speakerlab" / "diarization").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                tops = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                tops = [node.module.split(".")[0]]
            else:
                continue
            for top in tops:
                if top in sys.stdlib_module_names or top == "speakerlab":
                    continue
                if not {name(d) for d in provided.get(top, [])} & installed:
                    missing.append(f"{path.relative_to(ROOT)}:{node.lineno}: {top} ({provided.get(top)})")
    assert not missing, "imported, but in neither requirements.txt nor the diarization list: " + "; ".join(missing)
