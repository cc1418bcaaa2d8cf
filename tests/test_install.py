"""Installing this project: every `pip install` line users read installs this project (from the clone or a
wheel built from it), never PyPI's `speakerlab` (3D-Speaker's package); the distribution names are ours."""

from __future__ import annotations

import re
import shlex

import pytest

from tests.helpers import ROOT

# Options of `pip install` whose next word is a value, not a requirement.
VALUE_OPTIONS = {"-r", "--requirement", "-c", "--constraint", "--index-url", "-i", "--extra-index-url", "-f"}
VALUE_OPTIONS |= {"--find-links", "-t", "--target", "--prefix", "--root", "-w"}


def install_lines():
    """(file:line, the words after `pip install`) of README.md, docs/, the recipes' READMEs, the code's messages."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "egs").glob("*/README.md"))]
    files += sorted((ROOT / "speakerlab").rglob("*.py")) + sorted((ROOT / "egs" / "tools").glob("*.sh"))
    for path in files:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for m in re.finditer(r"pip install ([^`\n]*)", line):
                # The command ends at a comment, a closing quote or parenthesis, `;` or `&&`.
                command = re.split(r"\s#|[`);\"]|&&|, | or | then | in ", m.group(1))[0]
                yield f"{path.relative_to(ROOT)}:{number}", command


def requirement_names(command: str):
    """The distribution names a `pip install` command asks an index for (paths and wheels are not names)."""
    words = shlex.split(command.replace("'", " ").replace('"', " "))
    skip = False
    for word in words:
        if skip or word.startswith("-"):
            skip = word in VALUE_OPTIONS
            continue
        if word.startswith((".", "/", "~", "<", "$")) or word.endswith(".whl") or "/" in word:
            continue  # a path: the clone, ./runtime, a built wheel
        yield re.split(r"[\[<>=!~; ]", word, maxsplit=1)[0].lower().replace("_", "-")


def project_name(pyproject) -> str:
    """[project].name of a pyproject.toml (tomllib is Python >= 3.11; the project supports 3.10)."""
    return re.search(r'^\[project\]\n(?:.*\n)*?name = "([^"]+)"', pyproject.read_text(), re.M).group(1)


def test_the_distributions_are_not_named_like_3d_speakers_package():
    assert project_name(ROOT / "pyproject.toml") == "speakerlab-recipes"


def test_every_install_line_installs_this_project_not_the_one_named_speakerlab_on_pypi():
    lines = list(install_lines())
    assert len(lines) >= 10  # README, docs and the error messages do have install lines
    ours = []
    for where, command in lines:
        for name in requirement_names(command):
            # speakerlab is 3D-Speaker's on PyPI; ours are on no index: from the clone or a wheel only.
            assert name != "speakerlab" and not name.startswith("speakerlab-recipes"), f"{where}: pip install {command}"
        ours += [where for word in ("-e .", "./runtime", ".whl") if word in command]
    # README says how to install the full project and the runtime, docs/deployment.md the runtime.
    assert any(w.startswith("README.md") for w in ours) and any(w.startswith("docs/deployment.md") for w in ours)


@pytest.mark.parametrize(
    "command, names",
    [
        ("speakerlab[runtime]", ["speakerlab"]),
        ("--no-deps speakerlab", ["speakerlab"]),
        ('"numpy>=1.24" "scipy>=1.10"', ["numpy", "scipy"]),
        ("-e '.[diarization]'", []),
        ("./runtime", []),
        ("dist/speakerlab_recipes-0.1.0-py3-none-any.whl", []),
        ("torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu", ["torch"]),
    ],
)
def test_requirement_names_reads_what_an_index_is_asked_for(command, names):
    assert list(requirement_names(command)) == names
