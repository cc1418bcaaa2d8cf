"""The package's rooms as a newcomer meets them: no folder of more than a dozen modules, no module over ~400
lines, and every file README's Layout names is in the folder it is listed under."""

import re
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "speakerlab"
MAX_MODULES_PER_FOLDER = 12
MAX_MODULE_LINES = 400


def package_folders() -> List[Path]:
    return [PACKAGE, *sorted(p for p in PACKAGE.rglob("*") if p.is_dir() and p.name != "__pycache__")]


def test_no_folder_holds_more_than_a_dozen_modules():
    """A newcomer scans a folder at a glance; past a dozen modules it is split by concern into rooms."""
    crowded = {}
    for folder in package_folders():
        modules = [p for p in folder.glob("*.py") if p.stem not in ("__init__", "__main__")]
        if len(modules) > MAX_MODULES_PER_FOLDER:
            crowded[str(folder.relative_to(ROOT))] = len(modules)
    assert not crowded, f"split these by concern: {crowded}"


def test_no_module_is_longer_than_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 400}
    assert not long, f"split these by concern: {long}"


def layout_entries() -> List[Tuple[str, str]]:
    """README's Layout block -> (folder under which a line stands, a `name.py` it names), folders from indentation:
    `  dataio/ ...` opens speakerlab/dataio, `    tables/ ...` below it opens speakerlab/dataio/tables."""
    text = (ROOT / "README.md").read_text()
    block = text.split("## Layout", 1)[1].split("```")[1]
    stack: Dict[int, str] = {}
    entries = []
    for line in block.splitlines():
        entry = re.match(r"^( *)(\w+)(/|\.py\b)", line)  # a line that opens with a folder or a file is an entry
        if entry and len(entry.group(1)) < 16:  # deeper lines continue the one above (the description column)
            depth = len(entry.group(1)) // 2
            stack = {d: name for d, name in stack.items() if d < depth}
            if entry.group(3) == "/":
                stack[depth] = entry.group(2)
        where = "/".join(stack[d] for d in sorted(stack))
        entries += [(where, name) for name in re.findall(r"(?<![\w/])(\w+\.py)\b", line)]
    return entries


def test_every_file_the_readme_layout_names_is_where_it_says():
    entries = layout_entries()
    # the parser reads the nesting: these are known to be listed, each in its room
    assert ("speakerlab/dataio/tables", "trials.py") in entries
    assert ("speakerlab/inference/deploy", "runtime.py") in entries
    missing = [f"{where}/{name}" for where, name in entries if not (ROOT / where / name).is_file()]
    assert not missing, f"README's Layout names files that are not there: {missing}"
