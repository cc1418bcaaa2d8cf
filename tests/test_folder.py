"""`python -m speakerlab.datasets.folder.cli`: a folder tree or CSV of one's own recordings -> Kaldi data dirs with a
speaker-disjoint split and balanced trials. Its bad-input catalogue: every file that is not used has one report
line saying why (asserted exactly), every malformed list one error naming FILE:LINE, and nothing is lost."""

from __future__ import annotations

import csv
import hashlib
import os
import re
import stat
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from speakerlab.dataio.tables.lists import load_data_dir
from speakerlab.dataio.tables.prepare import prepare as index_data_dir
from speakerlab.dataio.tables.trials import IdIndex, read_trial_list
from speakerlab.dataio.waveform.resample import rate_ratio, resample
from speakerlab.datasets.filecheck import check_file
from speakerlab.datasets.folder.cli import main as folder_main
from speakerlab.datasets.split import split_sizes
from speakerlab.outputs import OutputError
from tests.helpers import write_wav

SAFE = re.compile(r"^[A-Za-z0-9_.-]+$")


def tone(seconds: float, rate: int = 16000, seed: int = 0, channels: int = 1) -> np.ndarray:
    x = 0.1 * np.random.default_rng(seed).standard_normal((int(seconds * rate), channels))
    return x[:, 0] if channels == 1 else x


def tree(root: Path, speakers=("a", "b", "c", "d", "e"), utts: int = 3, seconds: float = 1.2) -> Path:
    """root/<speaker>/<n>.wav, 16 kHz mono."""
    for i, s in enumerate(speakers):
        for u in range(utts):
            write_wav(root / s / f"{u}.wav", tone(seconds, seed=10 * i + u))
    return root


def run(tmp_path, *args, root=None, check=True):
    out = tmp_path / "out"
    src = ["--root", str(root)] if root is not None else []
    code = folder_main([*src, "--data", str(out), "--jobs", "1", "--test-speakers", "2", *args])
    if check:
        assert code == 0
    return code, out


def report(out: Path) -> list:
    return (out / "report.txt").read_text().splitlines()


def used(out: Path) -> dict:
    """Original path -> utterance id, from sources.csv."""
    with open(out / "sources.csv", newline="") as f:
        return {r["path"]: r["utt"] for r in csv.DictReader(f)}


# ---------------------------------------------------------------- the catalogue: files left out, each said


def test_every_bad_file_has_its_report_line_and_nothing_is_lost(tmp_path, capsys):
    root = tree(tmp_path / "root")
    bad = root / "a"
    cases = {
        "zero.wav": None,
        "junk.wav": None,
        "header.wav": np.zeros(0),
        "short.wav": tone(0.5),
        "nan.wav": np.full(16000, np.nan, np.float32),
        "inf.wav": np.r_[tone(1.0), np.inf].astype(np.float32),
        "silent.wav": np.zeros(20000),
        "odd_rate.wav": tone(1.2, rate=16001),
    }
    for name, samples in cases.items():
        if samples is None:
            (bad / name).write_bytes(b"" if name == "zero.wav" else b"RIFF\0\0\0\0WAVEjunk")
        else:
            rate = 16001 if name == "odd_rate.wav" else 16000
            write_wav(bad / name, samples, rate, subtype="FLOAT" if samples.dtype == np.float32 else "PCM_16")
    (bad / "notes.txt").write_text("not audio")
    (root / "stray.wav").write_bytes((bad / "0.wav").read_bytes())
    write_wav(bad / "stereo.wav", tone(1.2, seed=5, channels=2))
    lonely = root / "f" / "only.wav"
    write_wav(lonely, tone(1.2))
    for name in ("0.wav", "1.wav"):  # a speaker whose files are all unusable
        write_wav(root / "g" / name, np.zeros(20000))
    _, out = run(tmp_path, root=root)
    with pytest.raises(ValueError) as odd:
        rate_ratio(16001, 16000)
    odd_rate_problem = str(odd.value)
    lines = report(out)
    assert any(line.startswith(f"{bad / 'junk.wav'}: left out: unreadable (") and "junk.wav" in line for line in lines)
    expected = [
        f"{bad / 'zero.wav'}: left out: empty (0 bytes: an interrupted copy or download?)",
        f"{bad / 'header.wav'}: left out: empty (no samples)",
        f"{bad / 'short.wav'}: left out: too short (0.50 s < --min-seconds 1)",
        f"{bad / 'nan.wav'}: left out: non-finite samples (NaN or inf)",
        f"{bad / 'inf.wav'}: left out: non-finite samples (NaN or inf)",
        f"{bad / 'silent.wav'}: left out: silent (every sample is 0)",
        f"{bad / 'odd_rate.wav'}: left out: {odd_rate_problem}",
        f"{bad / 'notes.txt'}: left out: not an audio file (by its extension)",
        f"{root / 'stray.wav'}: left out: not in a speaker folder",
        f"{bad / 'stereo.wav'}: kept: first of 2 channels",
        f"{lonely}: left out: speaker with too few files ('f': 1 < --min-utts 2)",
        f"{root / 'g' / '0.wav'}: left out: silent (every sample is 0)",
    ]
    for line in expected:
        assert line in lines, line
    err = capsys.readouterr().err
    assert "speaker 'f': 1 usable file(s), fewer than --min-utts 2; left out" in err
    assert "speaker 'g': no usable file; left out" in err
    counts = re.search(
        r"(\d+) files, (\d+) of them audio, read in \d+ s: (\d+) used .* (\d+) left out \(([^)]*)\)", err
    )
    assert counts, err
    n_files = sum(1 for p in root.rglob("*") if p.is_file())
    assert int(counts.group(1)) == n_files and int(counts.group(2)) == n_files - 2  # notes.txt, stray.wav
    assert "empty 2, non-finite samples 2, not an audio file 1, not in a speaker folder 1" in counts.group(5)
    # Nothing lost: every file is used (sources.csv) or left out with a reason (report.txt), never both.
    out_paths = {line.split(": left out: ")[0] for line in lines if ": left out: " in line}
    assert set(used(out)) | out_paths == {str(p) for p in root.rglob("*") if p.is_file()}
    assert not set(used(out)) & out_paths and int(counts.group(3)) == len(used(out))


def test_links_and_truncated_files_say_what_they_are(tmp_path):
    """A broken link names its target, a link loop says so, a WAV shorter than its header promises (which
    libsndfile reads without a word) is left out as truncated: none of them "does not exist"."""
    root = tree(tmp_path / "root")
    (root / "a" / "broken.wav").symlink_to(tmp_path / "moved" / "take1.wav")
    (root / "a" / "self.wav").symlink_to("self.wav")
    (root / "a" / "ping.wav").symlink_to("pong.wav")
    (root / "a" / "pong.wav").symlink_to("ping.wav")
    whole = write_wav(tmp_path / "whole.wav", tone(2.0)).read_bytes()
    (root / "b" / "cut.wav").write_bytes(whole[: 44 + 2 * 24000])  # 1.5 s of the 2 s the header promises
    _, out = run(tmp_path, root=root)
    lines = report(out)
    a = root / "a"
    assert (
        f"{a / 'broken.wav'}: left out: a broken symbolic link: its target {tmp_path}/moved/take1.wav does not exist"
        in (lines)
    )
    assert f"{a / 'self.wav'}: left out: a symbolic link loop ({a / 'self.wav'} -> self.wav -> ...)" in lines
    assert f"{a / 'ping.wav'}: left out: a symbolic link loop ({a / 'ping.wav'} -> pong.wav -> ...)" in lines
    assert (
        f"{root / 'b' / 'cut.wav'}: left out: truncated (its header promises 2.00 s, the file holds 1.50 s: an "
        "interrupted copy or download?)" in lines
    )
    assert not any("does not exist" in line and "broken" not in line for line in lines), lines


@pytest.mark.parametrize("header", ["file,spk", "path,speaker", "Audio File,Speaker Name,Session"])
def test_a_csv_header_of_any_names_is_not_read_as_a_file(tmp_path, capsys, header):
    root = tree(tmp_path / "root")
    session = header.count(",") == 2
    rows = [f"{p},{p.parent.name}" + (f",s{p.stem}" if session else "") for p in sorted(root.rglob("*.wav"))]
    (tmp_path / "list.csv").write_text(header + "\n" + "\n".join(rows) + "\n")
    _, out = run(tmp_path, "--csv", str(tmp_path / "list.csv"))
    assert report(out) == [] and len(used(out)) == len(rows)
    assert f"{tmp_path / 'list.csv'}:1: a header row, not a file: {header}" in capsys.readouterr().err


def test_a_csv_without_header_uses_its_first_row(tmp_path):
    root = tree(tmp_path / "root")
    rows = [f"{p.relative_to(tmp_path)},{p.parent.name}" for p in sorted(root.rglob("*.wav"))]
    (tmp_path / "list.csv").write_text("\n".join(rows) + "\n")
    _, out = run(tmp_path, "--csv", str(tmp_path / "list.csv"))
    assert report(out) == [] and str(root / "a" / "0.wav") in used(out)


def test_a_missing_csv_file_is_reported(tmp_path):
    root = tree(tmp_path / "root")
    rows = [f"{p},{p.parent.name}" for p in sorted(root.rglob("*.wav"))] + [f"{root / 'a' / 'gone.wav'},a"]
    (tmp_path / "list.csv").write_text("path,speaker\n" + "\n".join(rows) + "\n")
    _, out = run(tmp_path, "--csv", str(tmp_path / "list.csv"))
    assert report(out) == [f"{root / 'a' / 'gone.wav'}: left out: does not exist"]


@pytest.mark.parametrize(
    "text, message",
    [
        ("path,speaker\n{a},a\n{b},b,s1,extra\n", "{csv}:3: expected path,speaker[,session], got 4 fields"),
        ("{a},a\n{b}\n", "{csv}:2: expected path,speaker[,session], got 1 fields"),
        ("{a},a\n{b},\n", "{csv}:2: empty speaker"),
        ("{a},a\n,b\n", "{csv}:2: empty path"),
        ("{a},a\n\n{b},b\n{a},c\n", "{csv}:4: {a} is listed twice (first on line 1)"),
        ("path,speaker\n", "{csv}: no rows"),
    ],
)
def test_malformed_csv_is_one_error_naming_the_line(tmp_path, capsys, text, message):
    root = tree(tmp_path / "root")
    a, b = root / "a" / "0.wav", root / "b" / "0.wav"
    path = tmp_path / "list.csv"
    path.write_text(text.format(a=a, b=b))
    code, out = run(tmp_path, "--csv", str(path), check=False)
    assert code == 2 and f"error: {message.format(csv=path, a=a)}" in capsys.readouterr().err
    assert not out.exists() or not (out / "train").exists()


def test_non_utf8_csv_is_named(tmp_path, capsys):
    (tmp_path / "list.csv").write_bytes(b"caf\xe9.wav,a\n")
    code, _ = run(tmp_path, "--csv", str(tmp_path / "list.csv"), check=False)
    assert code == 2 and f"error: {tmp_path / 'list.csv'}: not UTF-8 text" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--root", "{tmp}/nowhere"], "error: expected folder {tmp}/nowhere does not exist"),
        (["--root", "{tmp}/flat/x.wav"], "error: {tmp}/flat/x.wav is a file, not a folder: --root takes the folder"),
        (["--root", "{tmp}/flat"], "error: {tmp}/flat: no audio files in speaker folders"),
        (["--root", "{tmp}/root", "--test-speakers", "4"], "error: 5 usable speakers cannot give 4 test speakers"),
        (
            ["--root", "{tmp}/root", "--folder-sessions"],
            "error: {tmp}/out/test: the held-out speakers have no cross-session target pairs",
        ),
    ],
)
def test_unusable_input_is_one_error(tmp_path, capsys, args, message):
    tree(tmp_path / "root")
    write_wav(tmp_path / "flat" / "x.wav", tone(1.2))
    args = [a.format(tmp=tmp_path) for a in args]
    assert folder_main(["--data", str(tmp_path / "out"), "--jobs", "1", "--test-speakers", "2", *args]) == 2
    assert message.format(tmp=tmp_path) in capsys.readouterr().err


@pytest.mark.parametrize(
    "data, message",
    [
        ("my data", "error: --data: {out} holds whitespace or is not UTF-8: the lists name the converted and linked"),
        ("a file", "error: --data: {out} is a file, not a folder; choose another folder"),
        ("a file/below", "error: --data: {tmp}/a file is a file, not a folder (so {out} cannot be made)"),
    ],
)
def test_an_unusable_data_folder_is_named_before_any_file_is_read(tmp_path, capsys, monkeypatch, data, message):
    """--data with whitespace (files converted or linked under it could not be listed) or under a file: refused
    first, naming --data, before the recordings are read."""
    import speakerlab.datasets.folder.cli as folder

    root = tree(tmp_path / "root", utts=2)
    write_wav(root / "a" / "8k.wav", tone(1.2, rate=8000))  # converted under --data
    (tmp_path / "a file").write_text("x")
    monkeypatch.setattr(folder, "check_all", lambda *a: pytest.fail("files read before --data was checked"))
    out = tmp_path / data
    assert folder_main(["--root", str(root), "--data", str(out), "--jobs", "1"]) == 2
    assert message.format(out=out, tmp=tmp_path) in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--test-speakers", "1"], "--test-speakers: must be auto, a count >= 2 or a fraction in (0, 1), got '1'"),
        (["--test-speakers", "1.5"], "must be auto, a count >= 2 or a fraction in (0, 1), got '1.5'"),
        (["--val-speakers", "-1"], "--val-speakers: must be auto, a count >= 0 or a fraction in (0, 1), got '-1'"),
        (["--trials", "1"], "--trials must be >= 2, got 1"),
        (["--min-utts", "1"], "--min-utts must be >= 2, got 1"),
        (["--folder-sessions", "--csv", "x.csv"], "--folder-sessions goes with --root"),
    ],
)
def test_bad_options_are_refused(tmp_path, capsys, args, message):
    src = [] if "--csv" in args else ["--root", str(tree(tmp_path / "root"))]
    with pytest.raises(SystemExit) as e:
        folder_main([*src, "--data", str(tmp_path / "out"), *args])
    assert e.value.code == 2 and message in capsys.readouterr().err


# ---------------------------------------------------------------- what comes out


def test_ids_are_safe_unique_and_the_lists_pass_the_features_stage(tmp_path):
    root = tmp_path / "root"
    names = {
        "alice": ["0.wav", "1.wav", "sub/0.wav", "sub-0.wav", "0.flac"],  # equal stems and flattened names
        "bob smith": ["take 1.wav", "take 2.wav"],
        "José": ["a.wav", "b.wav"],
        "张伟": ["一.wav", "二.wav"],
        "bob_smith": ["x.wav", "y.wav"],  # what "bob smith" cleans to
    }
    for i, (spk, files) in enumerate(names.items()):
        for j, f in enumerate(files):
            write_wav(root / spk / f, tone(1.2, seed=10 * i + j))
    _, out = run(tmp_path, root=root)
    sources = used(out)
    assert len(sources) == sum(map(len, names.values())) and len(set(sources.values())) == len(sources)
    speakers = set()
    for d in ("train", "test"):
        data = load_data_dir(out / d)
        for u in data.utts:
            spk = data.utt2spk[u]
            assert SAFE.match(u) and SAFE.match(spk) and "-" not in spk and u.startswith(spk + "-")
            assert not any(c.isspace() for c in data.wav[u])
            speakers.add(spk)
        index_data_dir(out / d)  # stage 2 reads every file and checks the lists
    assert len(speakers) == 5

    def sha(text: str) -> str:
        return hashlib.sha1(text.encode()).hexdigest()[:8]

    def utt(spk: str, f: str) -> str:
        return sources[str(root / spk / f)]

    assert utt("alice", "1.wav") == "alice-1"  # clean and alone: the name itself
    assert utt("alice", "0.wav") == f"alice-0_{sha(str(root / 'alice' / '0.wav'))}"  # 0.flac cleans alike
    assert utt("alice", "sub/0.wav") == f"alice-sub-0_{sha(str(root / 'alice' / 'sub' / '0.wav'))}"
    assert utt("bob smith", "take 1.wav").startswith(f"bob_smith_{sha('bob smith')}-take_1_")
    assert utt("bob_smith", "x.wav") == f"bob_smith_{sha('bob_smith')}-x"  # "bob smith" cleans to it
    assert utt("José", "a.wav") == f"Jos_{sha('José')}-a"
    assert utt("张伟", "一.wav").startswith(f"id_{sha('张伟')}-id_")
    with open(out / "sources.csv", newline="") as f:
        assert {r["speaker"] for r in csv.DictReader(f)} == set(names)


def test_other_rates_channels_and_formats_are_converted(tmp_path):
    root = tree(tmp_path / "root")
    stereo = tone(1.5, rate=44100, seed=3, channels=2)
    write_wav(root / "a" / "call.flac", stereo, 44100)
    narrow = tone(1.3, rate=8000, seed=4)
    write_wav(root / "b" / "phone.wav", narrow, 8000)
    sf.write(str(root / "c" / "talk.ogg"), tone(1.2, seed=6), 16000, format="OGG", subtype="VORBIS")
    write_wav(root / "d" / "in place.wav", tone(1.2, seed=7))
    _, out = run(tmp_path, root=root)
    sources = used(out)
    wav = {**load_data_dir(out / "train").wav, **load_data_dir(out / "test").wav}
    lengths = {}
    for d in ("train", "test"):
        lengths.update(line.split() for line in (out / d / "utt2num_samples").read_text().splitlines())
    for path, original, rate in (
        (root / "a" / "call.flac", stereo[:, 0], 44100),
        (root / "b" / "phone.wav", narrow, 8000),
    ):
        converted = wav[sources[str(path)]]
        x, sr = sf.read(converted, dtype="float32")
        expected = resample(sf.read(str(path), dtype="float32", always_2d=True)[0][:, 0], rate, 16000)
        assert sr == 16000 and x.ndim == 1 and len(x) == int(lengths[sources[str(path)]]) == len(expected)
        np.testing.assert_allclose(x, expected, atol=1.5 / 32768)
        assert len(original) * 16000 // rate <= len(x) <= len(original) * 16000 // rate + 1
    ogg = wav[sources[str(root / "c" / "talk.ogg")]]
    assert ogg.startswith(str(out / "audio")) and sf.info(ogg).format == "WAV"
    link = Path(wav[sources[str(root / "d" / "in place.wav")]])
    assert " " not in str(link) and link.is_symlink() and link.resolve() == (root / "d" / "in place.wav").resolve()
    assert wav[sources[str(root / "a" / "0.wav")]] == str(root / "a" / "0.wav")  # used where it is


def test_a_file_name_that_is_not_utf8_is_linked_not_left_out(tmp_path):
    # A Latin-1 name (bytes that are no UTF-8) in a speaker folder and as a speaker folder: the files are read and
    # linked under audio/, as the help says, not left out as "unreadable" (soundfile cannot encode such a str).
    root = tree(tmp_path / "root")
    write_wav(tmp_path / "x.wav", tone(1.2, seed=8))
    os.rename(tmp_path / "x.wav", os.fsdecode(bytes(root / "a") + b"/caf\xe9.wav"))
    os.mkdir(os.fsdecode(bytes(root) + b"/sp\xffk"))
    for u in range(2):
        write_wav(tmp_path / "y.wav", tone(1.2, seed=9 + u))
        os.rename(tmp_path / "y.wav", os.fsdecode(bytes(root) + b"/sp\xffk/%d.wav" % u))
    (root / "b" / "junk.wav").write_bytes(b"not audio" * 100)  # a UTF-8 name's report line names it as a str
    _, out = run(tmp_path, root=root)
    junk = f"{root / 'b' / 'junk.wav'}: left out: unreadable (Error opening '{root / 'b' / 'junk.wav'}': "
    assert report(out) == [junk + "Format not recognised.)"]
    wav = {**load_data_dir(out / "train").wav, **load_data_dir(out / "test").wav}
    links = [Path(p) for p in wav.values() if p.startswith(str(out / "audio"))]
    assert len(wav) == 18 and len(links) == 3 and all(SAFE.match(p.name) and p.is_symlink() for p in links)
    assert sorted(os.fsencode(p.resolve().name) for p in links) == [b"0.wav", b"1.wav", b"caf\xe9.wav"]


def test_a_second_link_to_a_folder_is_said_not_dropped_silently(tmp_path):
    # Links to folders are followed, each real folder once: a second speaker folder linking to the same recordings
    # (and a link back up the tree) used to vanish without a report line; now each has one naming the first.
    root = tree(tmp_path / "root")
    tree(tmp_path / "elsewhere", speakers=("real",))
    (root / "alice").symlink_to(tmp_path / "elsewhere" / "real")
    (root / "bob").symlink_to(tmp_path / "elsewhere" / "real")
    (root / "a" / "up").symlink_to("..")
    _, out = run(tmp_path, root=root)
    assert report(out) == [
        f"{root / 'a' / 'up'}: left out: a link to a folder read already ({root})",
        f"{root / 'bob'}: left out: a link to a folder read already ({root / 'alice'})",
    ]
    assert sorted({r.split("-")[0] for r in used(out).values()}) == ["a", "alice", "b", "c", "d", "e"]


def test_split_is_speaker_disjoint_and_seeded(tmp_path):
    root = tree(tmp_path / "root", speakers=[f"s{i}" for i in range(12)], utts=2, seconds=1.0)

    def split(*args):
        _, out = run(tmp_path, *args, root=root)
        return [sorted(set(load_data_dir(out / d).utt2spk.values())) for d in ("train", "test")]

    train, test = split("--test-speakers", "0.25")
    assert len(test) == 3 and len(train) == 9 and not set(train) & set(test)
    assert split("--test-speakers", "0.25") == [train, test]
    assert split("--test-speakers", "0.25", "--seed", "1")[1] != test
    assert len(split("--test-speakers", "5")[1]) == 5


@pytest.mark.parametrize(
    "speakers, sizes", [(5, (2, 0)), (12, (3, 0)), (16, (4, 2)), (90, (22, 11)), (200, (40, 20)), (1000, (100, 50))]
)
def test_held_out_sizes_by_default_as_split_py_says(speakers, sizes):
    assert split_sizes(speakers) == sizes
    assert split_sizes(speakers, 6, 0) == (6, 0) and split_sizes(speakers, 0.5, 0.25)[1] == round(speakers / 4)


def test_a_validation_split_beside_train_and_test_and_its_warnings(tmp_path, capsys):
    """16 speakers: 4 test and 2 validation speakers by default, each split with its trials, the test speakers
    those of a split without validation; both held-out splits are too small to measure, and each says so."""
    root = tree(tmp_path / "root", speakers=[f"s{i:02d}" for i in range(16)], utts=3, seconds=1.0)
    out = tmp_path / "out"
    assert folder_main(["--root", str(root), "--data", str(out), "--jobs", "1"]) == 0
    err = capsys.readouterr().err
    spk = {d: set(load_data_dir(out / d).utt2spk.values()) for d in ("train", "val", "test")}
    assert [len(spk[d]) for d in ("train", "val", "test")] == [10, 2, 4]
    assert not (spk["train"] & spk["val"] or spk["train"] & spk["test"] or spk["val"] & spk["test"])
    assert "datasets: speakers: 10 train, 2 val, 4 test (--test-speakers auto, --val-speakers auto)" in err
    for d, n in (("val", 2), ("test", 4)):
        trials = read_trials(out / d)
        assert {load_data_dir(out / d).utt2spk[a] for a, _, _ in trials} <= spk[d]
        warning = (
            f"warning: {out / d / 'trials'}: too few to tell models apart by the EER: {n} speakers (20 needed), "
            f"{3 * n} target trials (600 needed); "
        )
        assert warning in err and err.count(f"warning: {out / d / 'trials'}") == 1
    with open(out / "sources.csv", newline="") as f:
        sets = Counter(r["set"] for r in csv.DictReader(f))
    assert sets == {"train": 30, "val": 6, "test": 12}
    assert folder_main(["--root", str(root), "--data", str(out), "--jobs", "1", "--val-speakers", "0"]) == 0
    assert not (out / "val").exists() and set(load_data_dir(out / "test").utt2spk.values()) == spk["test"]


def test_the_small_end_says_that_its_eer_means_nothing(tmp_path, capsys):
    """The issue's case: 12 speakers hold out 3 for testing, and a warning line says so."""
    root = tree(tmp_path / "root", speakers=[f"s{i}" for i in range(12)], utts=4, seconds=1.0)
    assert folder_main(["--root", str(root), "--data", str(tmp_path / "out"), "--jobs", "1"]) == 0
    err = capsys.readouterr().err
    assert "speakers: 9 train, 0 val, 3 test" in err
    assert "3 speakers (20 needed), 18 target trials (600 needed); the EER measured on it is coarse" in err


def read_trials(data) -> list:
    """`data`/trials parsed by the scoring's reader against `data`'s utterances: (enrol, test, target) rows."""
    index = IdIndex(load_data_dir(data).utts, "utt2spk")
    t = read_trial_list(data / "trials", index)
    return [(index.ids[e], index.ids[u], bool(y)) for e, u, y in zip(t.enrol, t.test, t.target)]


def test_trials_are_balanced_and_cross_session(tmp_path, capsys):
    root = tmp_path / "root"
    for i in range(6):
        for sess in range(2):
            for u in range(3):
                write_wav(root / f"s{i}" / f"day{sess}" / f"{u}.wav", tone(1.0, seed=100 * i + 10 * sess + u))
    _, out = run(tmp_path, "--folder-sessions", "--test-speakers", "4", "--trials", "40", root=root)
    test = load_data_dir(out / "test")
    sess = dict(line.split() for line in (out / "test" / "utt2sess").read_text().splitlines())
    trials = read_trials(out / "test")
    assert Counter(target for _, _, target in trials) == {True: 20, False: 20}
    assert len({(enrol, test_utt) for enrol, test_utt, _ in trials}) == 40
    for enrol, test_utt, target in trials:
        same = test.utt2spk[enrol] == test.utt2spk[test_utt]
        assert same == target and enrol != test_utt
        if target:
            assert sess[enrol] != sess[test_utt]
    # All of them when fewer exist: 4 speakers x 3 x 3 cross-session pairs = 36 targets, said in one line.
    capsys.readouterr()
    _, out = run(tmp_path, "--folder-sessions", "--test-speakers", "4", "--trials", "1000", root=root)
    assert Counter(target for _, _, target in read_trials(out / "test")) == {True: 36, False: 36}
    note = "only 36 cross-session target pairs exist: 72 trials (36 target, 36 nontarget) of the 1000 asked for"
    assert f"{out / 'test' / 'trials'}: {note}\n" in capsys.readouterr().err


def test_rerun_gives_the_same_lists_and_drops_stale_conversions(tmp_path):
    root = tree(tmp_path / "root")
    write_wav(root / "a" / "x.wav", tone(1.2, rate=8000), 8000)
    _, out = run(tmp_path, root=root)
    first = {p.name: p.read_bytes() for d in ("train", "test") for p in (out / d).iterdir()}
    converted = list((out / "audio").iterdir())
    assert len(converted) == 1
    _, out = run(tmp_path, root=root)
    assert {p.name: p.read_bytes() for d in ("train", "test") for p in (out / d).iterdir()} == first
    (root / "a" / "x.wav").unlink()
    run(tmp_path, root=root)
    assert list((out / "audio").iterdir()) == []


def test_output_inside_the_tree_is_not_read(tmp_path):
    root = tree(tmp_path / "root")
    write_wav(root / "a" / "x.wav", tone(1.2, rate=8000), 8000)
    out = root / "prepared"
    for _ in range(2):
        assert folder_main(["--root", str(root), "--data", str(out), "--jobs", "2", "--test-speakers", "2"]) == 0
    assert "prepared" not in (out / "report.txt").read_text()
    assert not any("prepared" in p for p in used(out))


def test_trials_drawn_one_by_one_from_many_pairs_obey_the_same_rules(monkeypatch):
    """Beyond ENUMERATE_PAIRS candidate pairs, pairs are drawn one at a time: still distinct, valid, balanced."""
    import speakerlab.datasets.split as split

    monkeypatch.setattr(split, "ENUMERATE_PAIRS", 10)
    spk2utt = {f"s{i}": [f"s{i}-{u}" for u in range(8)] for i in range(5)}
    sessions = {u: str(int(u[-1]) % 3) for us in spk2utt.values() for u in us}
    trials, note = split.make_trials(spk2utt, sessions, 60, seed=3)
    assert note == "" and Counter(t for _, _, t in trials) == {True: 30, False: 30}
    assert len({(a, b) for a, b, _ in trials}) == 60 and all(a < b for a, b, _ in trials)
    for a, b, target in trials:
        assert (a.split("-")[0] == b.split("-")[0]) == target
        assert not target or sessions[a] != sessions[b]
    assert split.make_trials(spk2utt, sessions, 60, seed=3) == (trials, "")


def test_a_device_where_a_link_goes_is_refused_and_stays(tmp_path):
    # A kept file whose path a list cannot hold (a space) is linked into the data folder by a rename: never over a
    # device (running as root, it would be replaced by the link).
    src = write_wav(tmp_path / "with space" / "a.wav", tone(1.2))
    dest = tmp_path / "audio" / "u1"
    dest.parent.mkdir()
    try:
        os.mknod(f"{dest}.wav", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        os.mkfifo(f"{dest}.wav")
    with pytest.raises(OutputError, match="is a device or a pipe"):
        check_file((str(src), str(dest), 16000, 1.0))
    assert not stat.S_ISREG(os.lstat(f"{dest}.wav").st_mode) and not os.path.islink(f"{dest}.wav")
    assert check_file((str(src), str(tmp_path / "audio" / "u2"), 16000, 1.0)).how == "linked"
