"""Vectorised trial-list parsing (speakerlab.dataio.tables.trials) against a direct line-by-line parse
and the bad inputs."""

import re

import numpy as np
import pytest

from speakerlab.dataio.tables.lists import ListError
from speakerlab.dataio.tables.trials import IdIndex, read_trial_list

IDS = ["a", "ab", "abc", "id10001/1zcIwhmdeo4/00001.wav", "id10001/1zcIwhmdeo4/00002.wav", "x" * 40, "ü-ß", "12345678"]


def _direct_parse(path):
    """The format by its definition, one line at a time: (enrol, test, target, line) of each trial line."""
    labels = {"target": True, "nontarget": False, "1": True, "0": False}
    out = []
    for n, line in enumerate(path.read_bytes().decode().split("\n"), 1):
        fields = line.split()
        if fields and not fields[0].startswith("#"):
            out.append((fields[0], fields[1], labels[fields[2]], n))
    return out


def _as_tuples(tl):
    ids = tl.index.ids
    return [(ids[a], ids[b], bool(t), int(n)) for a, b, t, n in zip(tl.enrol, tl.test, tl.target, tl.line)]


@pytest.mark.parametrize("block_bytes", [7, 50, 1 << 20])
def test_parse_matches_line_reader(tmp_path, block_bytes):
    """Blank lines, comments, tabs, CRLF, repeated spaces, 1/0 labels, no final newline; blocks cut anywhere."""
    p = tmp_path / "trials"
    p.write_bytes(
        "a ab target\n\n# a comment line\nabc\tid10001/1zcIwhmdeo4/00001.wav nontarget\r\n"
        "  ü-ß   12345678 1\nid10001/1zcIwhmdeo4/00002.wav xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx 0\n"
        "ab a nontarget".encode()
    )
    want = _direct_parse(p)
    got = _as_tuples(read_trial_list(p, IdIndex(IDS), block_bytes=block_bytes, threads=2))
    assert got == want


def test_fast_path_many_lines_and_threads(tmp_path):
    rng = np.random.default_rng(0)
    ids = [f"spk{i // 7}/utt{i}" for i in range(500)]
    pairs = {(int(a), int(b)) for a, b in rng.integers(0, 500, (3000, 2))}
    lines = [f"{ids[a]} {ids[b]} {'target' if a // 7 == b // 7 else 'nontarget'}\n" for a, b in sorted(pairs)]
    p = tmp_path / "trials"
    p.write_text("".join(lines))
    tl = read_trial_list(p, IdIndex(ids), block_bytes=4096, threads=3)
    assert tl.enrol.tolist() == [a for a, _ in sorted(pairs)]
    assert tl.test.tolist() == [b for _, b in sorted(pairs)]
    assert tl.target.tolist() == [a // 7 == b // 7 for a, b in sorted(pairs)]
    assert tl.line.tolist() == list(range(1, len(pairs) + 1))


def test_index_lookup_is_exact():
    """Prefixes, longer and shorter tokens and unknown tokens: the same answers as a dict."""
    rng = np.random.default_rng(1)
    ids = sorted({"".join(rng.choice(list("ab/._0"), int(rng.integers(1, 30)))) for _ in range(2000)})
    index = IdIndex(ids)
    queries = ids + [i + "a" for i in ids[:200]] + [i[:-1] for i in ids[:200]] + ["zzz", "a" * 64]
    buf = np.frombuffer((" ".join(queries) + " " + "\0" * 80).encode(), np.uint8).copy()
    lengths = np.array([len(q.encode()) for q in queries])
    starts = np.r_[0, np.cumsum(lengths + 1)[:-1]]
    pos = {u: i for i, u in enumerate(ids)}
    assert index.lookup(buf, starts, lengths).tolist() == [pos.get(q, -1) for q in queries]


def test_duplicate_ids_in_index_raise():
    with pytest.raises(ListError, match="emb.npz: duplicate id 'b'"):
        IdIndex(["a", "b", "b"], "emb.npz")


def _write(tmp_path, text):
    p = tmp_path / "trials"
    p.write_text(text)
    return p


def test_malformed_line_names_file_and_line(tmp_path):
    p = _write(tmp_path, "a ab target\nab abc\n")
    with pytest.raises(ListError, match=re.escape(f"{p}:2: expected 'enrol test target|nontarget', got 'ab abc'")):
        read_trial_list(p, IdIndex(IDS))


def test_bad_label_names_file_and_line(tmp_path):
    p = _write(tmp_path, "a ab target\n\nab abc maybe\n")
    with pytest.raises(ListError, match=re.escape(f"{p}:3: label must be target or nontarget (or 1/0), got 'maybe'")):
        read_trial_list(p, IdIndex(IDS))


def test_duplicate_trial_names_both_lines(tmp_path):
    p = _write(tmp_path, "a ab target\nab abc nontarget\na ab target\n")
    with pytest.raises(ListError, match=re.escape(f"{p}:3: duplicate trial 'a ab' (first on line 1")):
        read_trial_list(p, IdIndex(IDS))


def test_missing_ids_are_all_listed_with_lines(tmp_path):
    p = _write(tmp_path, "a ab target\nnope ab nontarget\nab gone nontarget\nnope a target\n")
    with pytest.raises(ListError) as e:
        read_trial_list(p, IdIndex(IDS), block_bytes=16)
    msg = str(e.value)
    assert msg.startswith(f"{p}: 3 trial line(s) name ids without an embedding")
    assert f"{p}:2: 'nope' (also line 4)\n" in msg and msg.endswith(f"{p}:3: 'gone'")
    assert msg.count("'nope'") == 1  # each id once, at its first line


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n"])
def test_empty_list(tmp_path, text):
    p = _write(tmp_path, text)
    with pytest.raises(ListError, match=re.escape(f"{p}: no trials")):
        read_trial_list(p, IdIndex(IDS))


def test_missing_file(tmp_path):
    with pytest.raises(ListError, match="does not exist"):
        read_trial_list(tmp_path / "nope", IdIndex(IDS))
