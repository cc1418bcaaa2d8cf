"""Print the requirements of the given files (pip's `-r` includes followed) that this Python does not
satisfy, one per line as written (`soundfile>=0.12`); nothing when all are installed. egs/tools/env.sh
calls pip only for these, so a machine that already has everything (or has no network) never runs pip.

Only the forms the project's files use are understood: `name`, `name>=version`, `name==version`,
comments and `-r file`; versions compare by their leading numbers (2.11.0+cu130 >= 2.1)."""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path
from typing import List, Tuple


def numbers(version: str) -> Tuple[int, ...]:
    out = []
    for part in re.split(r"[.+]", version):
        digits = re.match(r"\d+", part)
        if not digits:
            break
        out.append(int(digits.group()))
    return tuple(out)


def satisfied(name: str, op: str, wanted: str) -> bool:
    try:
        have = metadata.version(name)
    except metadata.PackageNotFoundError:
        return False
    if not op:
        return True
    h, w = numbers(have), numbers(wanted)
    return h >= w if op == ">=" else h[: len(w)] == w


def missing(path: Path) -> List[str]:
    out = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("-r"):
            out += missing(path.parent / line[2:].strip())
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)\s*(>=|==)?\s*([^\s;]*)", line)
        if m is None:
            raise SystemExit(f"{path}: cannot read the requirement {line!r}")
        if not satisfied(m.group(1), m.group(2) or "", m.group(3)):
            out.append(line.replace(" ", ""))
    return out


if __name__ == "__main__":
    for requirement in dict.fromkeys(r for p in sys.argv[1:] for r in missing(Path(p))):
        print(requirement)
