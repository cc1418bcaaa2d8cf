"""Figures in README.md and docs/*.md are traceable to bench/RESULTS.md.

The convention: a paragraph (or table) that quotes measured figures names the RESULTS.md section they come from,
as a link to its anchor, `[...](bench/RESULTS.md#egs-mini-on-a-2-core-cpu)`, or as `bench/RESULTS.md, "Heading"`
(the start of the heading's text). Every figure of such a paragraph (percentages, seconds, minutes, x-ratios)
must then be a number of one of the sections it names, as written or rounded to the digits written (22.64% there
may be quoted as 22.6%; a section runs to the next heading of its level or above); figures in `code` are
settings, not checked. In README.md every paragraph with a figure must name its section; in docs/ a paragraph that cites
RESULTS.md must name one when it has figures."""

from __future__ import annotations

import re
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from tests.helpers import ROOT

RESULTS = ROOT / "bench" / "RESULTS.md"
FIGURE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)(?: ?(%)|x\b| (s|min|ms|h)\b)")
ANCHOR = re.compile(r"RESULTS\.md#([\w-]+)")
QUOTED = re.compile(r"RESULTS\.md, \"([^\"]+)\"")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def sections(text: str) -> Dict[str, Tuple[str, str]]:
    """RESULTS.md's anchor -> (heading, its section's text up to the next heading of its level or above)."""
    lines = text.splitlines()
    heads = [(i, len(m.group(1)), m.group(2)) for i, line in enumerate(lines) if (m := re.match(r"(#+) (.+)", line))]
    out = {}
    for n, (i, level, title) in enumerate(heads):
        end = next((j for j, lv, _ in heads[n + 1 :] if lv <= level), len(lines))
        out[slug(title)] = (title, "\n".join(lines[i:end]))
    return out


def figures(text: str) -> List[str]:
    """The numbers of the figures of `text` outside code spans: '4.11' of 4.11%, '215' of 215 s, '0.62' of 0.62x."""
    return [m.group(1) for m in FIGURE.finditer(re.sub(r"`[^`]*`", "", text))]


def quoted_in(figure: str, text: str) -> bool:
    """Whether a number of `text` is `figure`, as written or rounded half up to `figure`'s decimals."""
    step = Decimal(figure).as_tuple().exponent
    for number in re.findall(r"(?<![\w.])\d+(?:\.\d+)?", text.replace(",", "")):
        value = Decimal(number)
        if value.as_tuple().exponent <= step and value.quantize(Decimal(1).scaleb(step), ROUND_HALF_UP) == Decimal(
            figure
        ):
            return True
    return False


def blocks(path: Path) -> List[Tuple[int, str]]:
    """(first line, text) of the paragraphs and tables of a Markdown file, code blocks left out."""
    out, current, start, fenced = [], [], 0, False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced or not line.strip() or re.match(r"\s*(\d+\.|-) ", line):  # a list item is a paragraph
            if current:
                out.append((start, " ".join(current)))
            current = []
            if fenced or not line.strip():
                continue
        if not current:
            start = number
        current.append(line.strip())
    if current:
        out.append((start, " ".join(current)))
    return out


def cited(block: str, known: Dict[str, Tuple[str, str]]) -> List[str]:
    """The anchors of the RESULTS.md sections a block names (an unknown name fails the test)."""
    names = ANCHOR.findall(block)
    for quoted in QUOTED.findall(block):
        match = [a for a, (title, _) in known.items() if title.startswith(quoted)]
        assert match, f'no heading of bench/RESULTS.md starts with "{quoted}"'
        names.append(match[0])
    for name in names:
        assert name in known, f"bench/RESULTS.md has no section #{name}"
    return names


def problems(path: Path, known: Dict[str, Tuple[str, str]], strict: bool) -> List[str]:
    found = []
    for line, block in blocks(path):
        where, figs = f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name}:{line}", figures(block)
        names = cited(block, known)
        if not figs:
            continue
        if not names:
            if strict:
                found.append(f"{where}: figures {', '.join(figs)} name no section of bench/RESULTS.md")
            continue
        text = "\n".join(known[n][1] for n in names)
        missing = [f for f in figs if not quoted_in(f, text)]
        if missing:
            found.append(f"{where}: {', '.join(missing)} not in bench/RESULTS.md #{', #'.join(names)}")
    return found


def test_every_figure_of_readme_and_docs_is_in_the_results_section_it_names():
    known = sections(RESULTS.read_text())
    found = problems(ROOT / "README.md", known, strict=True)
    for path in sorted((ROOT / "docs").glob("*.md")):
        found += problems(path, known, strict=False)
    assert not found, "\n".join(found)


def test_the_check_catches_a_stale_figure_a_missing_section_and_an_unknown_one(tmp_path):
    known = sections(
        "# Measured\n\n## egs/mini on a 2-core CPU\n\n| EER | **4.06%**, 301 s, 1.5x |\n\n## Other\n\n9.9%\n"
    )
    assert list(known) == ["measured", "egsmini-on-a-2-core-cpu", "other"]
    doc = tmp_path / "doc.md"
    doc.write_text(
        "EER 4.1% in 301 s, 1.5x, `--collar 0.25` ([results](bench/RESULTS.md#egsmini-on-a-2-core-cpu)).\n\n"
        'EER 4.11% (bench/RESULTS.md, "egs/mini on").\n\n'
        "A figure without its source: 9.9%.\n\n```\n12.5% in a code block\n```\n"
    )
    assert [p.split(": ", 1)[1] for p in problems(doc, known, strict=True)] == [
        "4.11 not in bench/RESULTS.md #egsmini-on-a-2-core-cpu",
        "figures 9.9 name no section of bench/RESULTS.md",
    ]
    assert problems(doc, known, strict=False) == [problems(doc, known, strict=True)[0]]
    doc.write_text("2% (bench/RESULTS.md#no-such-section)\n")
    with pytest.raises(AssertionError, match="no section #no-such-section"):
        problems(doc, known, strict=True)


def test_every_config_of_the_model_table_exists():
    """docs/models.md's last column names `--config ../../conf/<file>` for each row: every such file (with `<N>` as
    b0-b6's digit) is in conf/. The ReDimNet2 row named `voxceleb_redimnet2_b<N>.yaml`, which no config is."""
    table = [ln for ln in (ROOT / "docs" / "models.md").read_text().splitlines() if ln.startswith("| ")][2:]
    named = [re.findall(r"`([^`]+\.yaml)`", ln.split("|")[-2]) for ln in table]
    assert all(named) and len(table) > 20
    for name in (n for row in named for n in row):
        files = [name.replace("<N>", str(n)) for n in range(7)] if "<N>" in name else [name]
        if "<model>" in name:
            continue  # several models: conf/<corpus>/<model>.yaml, checked for each by tests/test_config.py
        for f in files:
            assert (ROOT / "conf" / f).is_file(), f"docs/models.md names conf/{f}, which does not exist"
