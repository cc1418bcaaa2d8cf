"""README's Layout is where a newcomer looks for a file: every folder and module it names exists where it says, and
every subpackage of speakerlab (and every top-level module of speakerlab/ and of a folder whose line lists its
modules) is named there."""

import re
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = Path(__file__).resolve().parent.parent
NAME = re.compile(r"^[A-Za-z_][\w.]*(/|\.py)$")


def layout_block() -> List[str]:
    text = (ROOT / "README.md").read_text()
    start = text.index("## Layout")
    body = text[start:].split("```", 2)[1]
    return [line for line in body.splitlines() if line.strip()]


def layout_entries() -> Dict[Path, Tuple[str, ...]]:
    """Path named by the Layout -> the description text of its line and of its continuation lines."""
    entries: Dict[Path, List[str]] = {}
    parents: List[Tuple[int, Path]] = []  # (indent, folder) of the enclosing entries
    last = None
    for line in layout_block():
        indent = len(line) - len(line.lstrip())
        first, _, description = line.strip().partition("  ")
        names = [n.strip() for n in first.split(",")]
        if not all(NAME.match(n) for n in names):  # a continuation of the previous entry's description
            entries[last].append(line.strip())
            continue
        while parents and parents[-1][0] >= indent:
            parents.pop()
        base = parents[-1][1] if parents else ROOT
        for name in names:
            last = base / name.rstrip("/")
            entries[last] = [description.strip()]
            if name.endswith("/"):
                parents.append((indent, last))
    return {path: tuple(text) for path, text in entries.items()}


def test_every_path_of_the_layout_exists():
    missing = []
    for path, text in layout_entries().items():
        if not path.exists():
            missing.append(str(path.relative_to(ROOT)))
        if path.is_dir():  # modules and folders its description names (`loop.py (...)`, `ssl/`)
            for name in re.findall(r"\b([a-z_]\w*\.py|[a-z_]\w*/)(?=[\s,;:)]|$)", " ".join(text)):
                if not (path / name.rstrip("/")).exists() and not (ROOT / name.rstrip("/")).exists():
                    missing.append(f"{path.relative_to(ROOT)}/{name} (named in its description)")
    assert not missing, "README's Layout names what is not there: " + ", ".join(missing)


def test_every_package_and_module_is_in_the_layout():
    entries = layout_entries()
    named = set(entries)
    for path, text in entries.items():
        named |= {path / n.rstrip("/") for n in re.findall(r"\b([a-z_]\w*\.py|[a-z_]\w*/)", " ".join(text))}
    package = ROOT / "speakerlab"
    absent = [p.parent for p in package.rglob("__init__.py") if p.parent != package and p.parent not in named]
    absent += [p for p in package.glob("*.py") if p.name != "__init__.py" and p not in named]
    for folder, text in entries.items():  # a folder whose line lists its modules (3 or more) lists them all
        if folder.is_dir() and folder != package and len(re.findall(r"\b\w+\.py\b", " ".join(text))) >= 3:
            absent += [p for p in folder.glob("*.py") if p.stem not in ("__init__", "__main__") and p not in named]
    assert not absent, "not in README's Layout: " + ", ".join(str(p.relative_to(ROOT)) for p in absent)
