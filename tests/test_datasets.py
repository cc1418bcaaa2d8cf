"""speakerlab.datasets: download / md5 / resume / join / safe extraction, and each corpus's prepare step
on small fake archives laid out like the published ones. No network: "downloads" come from a fake
opener or from file:// URLs."""

import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from urllib.error import HTTPError

import pytest
import soundfile as sf

from speakerlab.dataio.tables.lists import load_data_dir
from speakerlab.dataio.tables.prepare import prepare as index_data_dir
from speakerlab.dataio.tables.trials import IdIndex, read_trial_list
from speakerlab.datasets import cnceleb, musan_rirs, threedspeaker, voxblink2, voxceleb
from speakerlab.datasets.archives import extract
from speakerlab.datasets.common import DatasetError
from speakerlab.datasets.download import (
    Archive,
    ChecksumError,
    DownloadError,
    Part,
    UnsafeArchiveError,
    download,
    fetch_archives,
    join_parts,
)
from tests.fake_corpora import (
    FAKE_FFMPEG,
    VOXBLINK2,
    cnceleb_blobs,
    md5,
    serve,
    split,
    tgz_bytes,
    threedspeaker_blobs,
    vox_blobs,
    voxblink2_blobs,
    with_md5,
    zip_bytes,
)

REPO = Path(__file__).resolve().parent.parent


def check_data_dir(root: Path, trials=()):
    """The lists agree with each other and with the audio; every trial id is an utterance."""
    d = load_data_dir(root)
    assert d.utts == sorted(d.wav) and all(os.path.isabs(p) and os.path.isfile(p) for p in d.wav.values())
    assert all(u.startswith(s) for u, s in d.utt2spk.items())
    for t in trials:
        read_trial_list(root / t, IdIndex(d.utts))  # raises naming any id not in wav.scp
    index_data_dir(root, jobs=1)  # the recipe's index stage accepts it (audio readable, 16 kHz mono)
    return d


# ---------------------------------------------------------------- download mechanics


class FakeResponse(io.BytesIO):
    def __init__(self, body, status, headers, break_after=None):
        super().__init__(body)
        self.status, self.headers, self._break, self._sent = status, headers, break_after, 0

    def read(self, n=-1):
        if self._break is not None:
            if self._sent >= self._break:
                raise ConnectionResetError("connection reset by peer")
            n = min(n if n > 0 else 1 << 30, self._break - self._sent)
        chunk = super().read(n)
        self._sent += len(chunk)
        return chunk


class FakeOpener:
    """Serves `files` (url -> bytes) like an HTTP server; `breaks` cuts the first transfer of a URL."""

    def __init__(self, files, honor_range=True, breaks=None, break_every=None):
        self.files, self.honor_range, self.breaks = files, honor_range, dict(breaks or {})
        self.break_every = break_every
        self.requests = []

    def open(self, req, timeout=None):
        url, rng = req.full_url, req.get_header("Range")
        self.requests.append((url, rng))
        if url not in self.files:
            raise HTTPError(url, 404, "Not Found", {}, None)
        data, start, status = self.files[url], 0, 200
        if rng and self.honor_range:
            start, status = int(rng[len("bytes=") : -1]), 206
        headers = {"Content-Length": str(len(data) - start)}
        if status == 206:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        brk = self.break_every if self.break_every is not None else self.breaks.pop(url, None)
        return FakeResponse(data[start:], status, headers, brk)


DATA = bytes(range(256)) * 40  # 10 KiB
URL = "https://example.org/corpus/file.zip"


def test_download_verifies_and_skips_a_verified_file(tmp_path):
    dest = download(URL, tmp_path / "file.zip", md5(DATA), opener=FakeOpener({URL: DATA}))
    assert dest.read_bytes() == DATA and (tmp_path / "file.zip.md5ok").exists()
    opener = FakeOpener({})
    download(URL, dest, md5(DATA), opener=opener)
    assert opener.requests == []


def test_md5_mismatch_is_an_error_naming_the_file(tmp_path):
    with pytest.raises(ChecksumError, match=r"file\.zip: md5 .* does not match the published 0+"):
        download(URL, tmp_path / "file.zip", "0" * 32, opener=FakeOpener({URL: DATA}))
    assert not (tmp_path / "file.zip").exists() and not (tmp_path / "file.zip.part").exists()


def test_broken_transfer_resumes_with_a_range_request(tmp_path):
    opener, waits = FakeOpener({URL: DATA}, breaks={URL: 3000}), []
    dest = download(URL, tmp_path / "file.zip", md5(DATA), opener=opener, retries=2, sleep=waits.append)
    assert dest.read_bytes() == DATA
    assert opener.requests == [(URL, None), (URL, "bytes=3000-")] and waits == [2.0]


def test_partial_file_of_an_earlier_run_is_resumed(tmp_path):
    (tmp_path / "file.zip.part").write_bytes(DATA[:5000])
    opener = FakeOpener({URL: DATA})
    assert download(URL, tmp_path / "file.zip", md5(DATA), opener=opener).read_bytes() == DATA
    assert opener.requests == [(URL, "bytes=5000-")]


def test_server_ignoring_range_restarts_the_file(tmp_path):
    (tmp_path / "file.zip.part").write_bytes(b"x" * 5000)
    dest = download(URL, tmp_path / "file.zip", md5(DATA), opener=FakeOpener({URL: DATA}, honor_range=False))
    assert dest.read_bytes() == DATA


def test_progress_resets_retries_and_a_dead_link_gives_up(tmp_path):
    opener, waits = FakeOpener({URL: DATA}, break_every=1000), []  # 1000 bytes per connection
    dest = download(URL, tmp_path / "a.zip", md5(DATA), opener=opener, retries=2, sleep=waits.append)
    assert dest.read_bytes() == DATA
    assert len(opener.requests) == 11 and set(waits) == {2.0}
    (tmp_path / "b.zip.part").write_bytes(DATA[:10])
    waits = []
    with pytest.raises(DownloadError, match=r"failed 3 times in a row .*b\.zip\.part is kept, re-run to resume"):
        download(URL, tmp_path / "b.zip", opener=FakeOpener({URL: DATA}, break_every=0), retries=2, sleep=waits.append)
    assert waits == [2.0, 4.0] and (tmp_path / "b.zip.part").read_bytes() == DATA[:10]


def test_missing_file_is_not_retried(tmp_path):
    waits = []
    with pytest.raises(DownloadError, match="HTTP Error 404"):
        download(URL, tmp_path / "file.zip", opener=FakeOpener({}), sleep=waits.append)
    assert waits == []


def test_mirror_and_url_overrides_and_part_joining(tmp_path):
    parts = split(DATA, 3)
    archive = Archive(
        "big.zip", md5(DATA), "https://official.example/x", parts=tuple(Part(f"big.zip.p{i}") for i in range(3))
    )
    files = {f"https://mirror.example/big.zip.p{i}": parts[i] for i in range(2)}
    files["https://elsewhere.example/p2"] = parts[2]
    opener = FakeOpener(files)
    [path] = fetch_archives(
        [archive],
        tmp_path,
        mirror="https://mirror.example/",
        opener=opener,
        urls={"big.zip.p2": "https://elsewhere.example/p2"},
    )
    assert path.read_bytes() == DATA and sorted(p.name for p in tmp_path.iterdir()) == ["big.zip", "big.zip.md5ok"]
    with pytest.raises(ChecksumError, match="joined.zip: md5 .* of the joined parts"):
        (tmp_path / "a").write_bytes(b"1")
        join_parts([tmp_path / "a"], tmp_path / "joined.zip", md5(b"2"))


def test_archive_dir_is_used_without_downloading(tmp_path):
    a = Archive("whole.tar.gz", md5(DATA), "https://nowhere.example")
    (tmp_path / "have").mkdir()
    (tmp_path / "have" / "whole.tar.gz").write_bytes(DATA)
    opener = FakeOpener({})
    assert fetch_archives([a], tmp_path / "dl", archive_dir=tmp_path / "have", opener=opener) == [
        tmp_path / "have" / "whole.tar.gz"
    ]
    assert opener.requests == []
    with pytest.raises(DownloadError, match="other.zip: not found in --archive-dir"):
        fetch_archives([Archive("other.zip", None, "x")], tmp_path / "dl", archive_dir=tmp_path / "have")


# ---------------------------------------------------------------- extraction


def test_extract_refuses_zip_path_traversal(tmp_path):
    (tmp_path / "bad.zip").write_bytes(zip_bytes({"ok.txt": b"1", "../evil.txt": b"2"}))
    with pytest.raises(UnsafeArchiveError, match=r"refusing member '\.\./evil\.txt'"):
        extract(tmp_path / "bad.zip", tmp_path / "out")
    assert not (tmp_path / "evil.txt").exists() and not (tmp_path / "out" / "ok.txt").exists()


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "symlink"])
def test_extract_refuses_tar_members_escaping(tmp_path, kind):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        info = tarfile.TarInfo({"dotdot": "a/../../evil", "absolute": str(tmp_path / "evil"), "symlink": "link"}[kind])
        if kind == "symlink":
            info.type, info.linkname = tarfile.SYMTYPE, "../../outside"
            tf.addfile(info)
        else:
            info.size = 1
            tf.addfile(info, io.BytesIO(b"x"))
    (tmp_path / "bad.tar.gz").write_bytes(buf.getvalue())
    with pytest.raises(UnsafeArchiveError, match="refusing"):
        extract(tmp_path / "bad.tar.gz", tmp_path / "out")
    assert not (tmp_path / "evil").exists() and not (tmp_path / "out" / "link").exists()


def test_extract_tar_and_skip_when_done(tmp_path):
    (tmp_path / "a.tar.gz").write_bytes(tgz_bytes({"top/x.txt": b"1"}))
    extract(tmp_path / "a.tar.gz", tmp_path / "out")
    assert (tmp_path / "out/top/x.txt").read_bytes() == b"1"
    (tmp_path / "out/top/x.txt").unlink()
    extract(tmp_path / "a.tar.gz", tmp_path / "out")  # marker: not unpacked again
    assert not (tmp_path / "out/top/x.txt").exists()


@pytest.mark.parametrize("damage", ["tar.gz cut short", "zip cut short", "zip member damaged"])
def test_a_damaged_archive_is_one_error_naming_it(tmp_path, capsys, damage):
    """An archive without a published md5 (3dspeaker_files.tar.gz), or one taken with --skip-md5, once stopped the
    extract step with tarfile's or zipfile's traceback; now one line naming the archive, no marker, exit 2."""
    members = {f"files/x{i}.txt": os.urandom(20000) for i in range(4)}
    blob = tgz_bytes(members) if damage.startswith("tar") else zip_bytes(members)
    blob = bytearray(blob[: len(blob) // 2] if "cut short" in damage else blob)
    if damage == "zip member damaged":
        blob[100:200] = bytes(100)
    name = "3dspeaker_files.tar.gz" if damage.startswith("tar") else "3dspeaker_files.zip"
    (tmp_path / name).write_bytes(bytes(blob))
    with pytest.raises(DownloadError, match=f"{tmp_path / name}: (truncated or corrupt archive|neither a zip)"):
        extract(tmp_path / name, tmp_path / "out")
    assert not (tmp_path / "out" / f".{name}.extracted").exists()
    if damage.startswith("tar"):  # through the command: one line, exit 2
        serve(tmp_path / "have", {"train.tar.gz": tgz_bytes({"train/a": b"1"}), "test.tar.gz": tgz_bytes({})})
        shutil.copy(tmp_path / name, tmp_path / "have" / name)
        raw = str(tmp_path / "raw")
        assert threedspeaker.main(["extract", "--archive-dir", str(tmp_path / "have"), "--raw-dir", raw]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith(f"error: {tmp_path / 'have' / name}: truncated or corrupt archive")
        assert "Traceback" not in "\n".join(err)


# ---------------------------------------------------------------- VoxCeleb


def test_voxceleb_download_extract_convert_prepare(tmp_path, monkeypatch, capsys):
    blobs = vox_blobs()
    joined = ("vox1_dev_wav.zip", "vox2_aac.zip")  # published only as parts
    mirror = serve(tmp_path / "server", {k: v for k, v in blobs.items() if k not in joined})
    dl, raw, data = str(tmp_path / "dl"), str(tmp_path / "raw"), tmp_path / "data"
    # the published md5s cannot match fake archives: an error naming the file
    assert voxceleb.main(["download", "--parts", "vox1", "--download-dir", dl, "--mirror", mirror, "--jobs", "1"]) == 2
    assert "vox1_test_wav.zip: md5" in capsys.readouterr().err
    monkeypatch.setattr(voxceleb, "PARTS", with_md5(voxceleb.PARTS, blobs))
    assert voxceleb.main(["download", "--download-dir", dl, "--mirror", mirror]) == 0
    assert sorted(p.name for p in Path(dl).iterdir() if not p.name.endswith(".md5ok")) == sorted(
        [
            "vox1_dev_wav.zip",
            "vox1_test_wav.zip",
            "vox2_aac.zip",
            "veri_test2.txt",
            "list_test_all2.txt",
            "list_test_hard2.txt",
        ]
    )  # parts were joined, verified and removed
    assert voxceleb.main(["extract", "--download-dir", dl, "--raw-dir", raw]) == 0
    assert (tmp_path / "raw/voxceleb2/dev/aac/id00012/21Uxsk56VDQ/00001.m4a").is_file()

    assert voxceleb.main(["prepare", "--raw-dir", raw, "--data", str(data), "--parts", "vox1"]) == 0
    dev, test = check_data_dir(data / "vox1_dev"), check_data_dir(data / "vox1_test", ["trials"])
    assert dev.utts[0] == "id10001-1zcIwhmdeo4-00001" and dev.utt2spk["id10002-0_laIeN-Q44-00002"] == "id10002"
    assert len(test.utts) == 3 and set(dev.speakers) == {"id10001", "id10002"}
    full = check_data_dir(data / "vox1", [f"trials_{n}" for n in voxceleb.TRIALS])
    assert len(full.utts) == 8
    assert (data / "vox1_test/trials").read_text() == (
        "id10270-x6uYqmx31kE-00001 id10270-8jEAjG6SegY-00008 target\n"
        "id10270-x6uYqmx31kE-00001 id10271-1gtz-CUIygI-00001 nontarget\n"
    )
    assert (data / "vox1/trials_vox1_e_clean").read_text().splitlines()[
        1
    ] == "id10001-1zcIwhmdeo4-00002 id10002-0_laIeN-Q44-00001 nontarget"

    # VoxCeleb2: without ffmpeg the error says how to install it; a stand-in ffmpeg checks the plumbing
    with monkeypatch.context() as m:
        m.setenv("PATH", str(tmp_path / "empty"))
        assert voxceleb.main(["convert", "--raw-dir", raw]) == 2
    assert "apt-get install ffmpeg" in capsys.readouterr().err
    fake = tmp_path / "bin" / "ffmpeg"
    fake.parent.mkdir()
    fake.write_text(FAKE_FFMPEG.format(python=sys.executable))
    fake.chmod(0o755)
    assert voxceleb.main(["convert", "--raw-dir", raw, "--jobs", "2", "--ffmpeg", str(fake)]) == 0
    assert voxceleb.main(["prepare", "--raw-dir", raw, "--data", str(data), "--parts", "vox2"]) == 0
    vox2 = check_data_dir(data / "vox2_dev")
    assert vox2.utts == ["id00012-21Uxsk56VDQ-00001", "id00012-21Uxsk56VDQ-00002", "id00015-0fijmz4vTVU-00001"]


@pytest.mark.skipif(
    shutil.which("ffmpeg") is None, reason="ffmpeg is not on PATH (.ci/run installs it: apt-get install ffmpeg)"
)
def test_voxceleb_convert_with_real_ffmpeg(tmp_path):
    src = tmp_path / "raw/voxceleb2/dev/aac/id00012/21Uxsk56VDQ/00001.m4a"
    src.parent.mkdir(parents=True)
    subprocess.run(
        [
            "ffmpeg",
            "-v",
            "error",
            "-f",
            "lavfi",
            "-i",
            "sine=frequency=440:duration=0.3:sample_rate=44100",
            "-c:a",
            "aac",
            str(src),
        ],
        check=True,
    )
    assert voxceleb.convert(tmp_path / "raw", jobs=1) == 1
    info = sf.info(str(tmp_path / "raw/voxceleb2/dev/wav/id00012/21Uxsk56VDQ/00001.wav"))
    assert (info.samplerate, info.channels, info.subtype) == (16000, 1, "PCM_16")


def test_voxceleb_missing_folder_is_named(tmp_path, capsys):
    assert voxceleb.main(["prepare", "--raw-dir", str(tmp_path), "--data", str(tmp_path / "d"), "--parts", "vox1"]) == 2
    assert f"expected folder {tmp_path}/voxceleb1/dev/wav does not exist" in capsys.readouterr().err


# ---------------------------------------------------------------- 3D-Speaker


def test_threedspeaker_from_archive_dir(tmp_path, monkeypatch):
    blobs = threedspeaker_blobs()
    have = tmp_path / "have"  # the user's own copies: the six parts, not the joined train.tar.gz
    serve(have, {k: v for k, v in blobs.items() if k != "train.tar.gz"})
    monkeypatch.setattr(threedspeaker, "PARTS", with_md5(threedspeaker.PARTS, blobs))
    dl, raw, data = str(tmp_path / "dl"), str(tmp_path / "raw"), tmp_path / "data"
    args = ["--download-dir", dl, "--archive-dir", str(have)]
    assert threedspeaker.main(["download", "--mirror", "https://unreachable.invalid", *args]) == 0
    assert sorted(os.listdir(have)) == sorted(k for k in blobs if k != "train.tar.gz")  # left untouched
    assert [n for n in sorted(os.listdir(dl)) if not n.endswith(".md5ok")] == ["train.tar.gz"]  # joined
    assert threedspeaker.main(["extract", *args, "--raw-dir", raw]) == 0
    assert threedspeaker.main(["prepare", "--raw-dir", raw, "--data", str(data)]) == 0
    train = check_data_dir(data / "3dspeaker_train")
    assert train.utts == ["S001_Device01_001", "S001_Device02_001", "S002-D01_Dis02_002", "S002-D03_Dis01_002"]
    names = [f"trials_{n}" for n in threedspeaker.TRIAL_LISTS]
    test = check_data_dir(data / "3dspeaker_test", names)
    assert not any("Device09" in u for u in test.utts) and len(test.utts) == 4
    assert (data / "3dspeaker_test/trials_cross_dialect").read_text() == (
        "S102-D01_Dis01_101 S102-D02_Dis03_102 target\nS101_Device01_001 S102-D02_Dis03_102 nontarget\n"
    )
    assert (data / "3dspeaker_test/trials_cross_device").read_text().split("\n")[
        1
    ] == "S101_Device01_001 S102-D01_Dis01_101 nontarget"


def test_threedspeaker_trial_on_left_out_device(tmp_path):
    root = tmp_path / "raw/3dspeaker"
    (root / "files").mkdir(parents=True)
    (root / "files/trials_x").write_text("A_Device01 A_Device09 1\n")
    with pytest.raises(DatasetError, match="Device09, which is left out; pass --keep-device09"):
        threedspeaker.convert_trials(root / "files/trials_x", tmp_path / "t", {"A_Device01": "A_Device01"}, False)
    assert not (tmp_path / "t").exists()


# ---------------------------------------------------------------- CN-Celeb


def test_cnceleb_download_extract_prepare(tmp_path, monkeypatch):
    blobs = cnceleb_blobs()
    mirror = serve(tmp_path / "server", {k: v for k, v in blobs.items() if k != "cn-celeb2_v2.tar.gz"})
    monkeypatch.setattr(cnceleb, "PARTS", with_md5(cnceleb.PARTS, blobs))
    dl, raw, data = str(tmp_path / "dl"), str(tmp_path / "raw"), tmp_path / "data"
    assert cnceleb.main(["download", "--download-dir", dl, "--mirror", mirror]) == 0
    assert cnceleb.main(["extract", "--download-dir", dl, "--raw-dir", raw]) == 0
    assert cnceleb.main(["prepare", "--raw-dir", raw, "--data", str(data)]) == 0
    train = check_data_dir(data / "cnceleb_train")
    assert train.speakers == ["id00000", "id00001", "id10000", "id10001"]  # dev.lst + CN-Celeb2, not id00800
    assert "id00000-singing-01-001" in train.utts and all(p.endswith(".flac") for p in train.wav.values())
    ev = check_data_dir(data / "cnceleb_eval", ["trials_cnceleb1"])
    assert ev.utt2spk["id00800-enroll"] == "id00800"
    assert ev.wav["id00800-enroll"].endswith("eval/enroll/id00800-enroll.flac")
    lines = (data / "cnceleb_eval/trials_cnceleb1").read_text().splitlines()
    assert len(lines) == 6 and lines[0] == "id00800-enroll id00800-singing-01-005 target"
    assert lines[2] == "id00800-enroll id00801-vlog-01-001 nontarget"


def test_cnceleb_missing_speaker_folder_is_named(tmp_path):
    (tmp_path / "CN-Celeb_flac/dev").mkdir(parents=True)
    (tmp_path / "CN-Celeb_flac/dev/dev.lst").write_text("id00000\n")
    with pytest.raises(DatasetError, match=r"CN-Celeb_flac/data/id00000 does not exist: speaker listed at .*dev.lst:1"):
        cnceleb.prepare(tmp_path, tmp_path / "data", ["cnceleb1"])


# ---------------------------------------------------------------- VoxBlink2


def test_voxblink2_parts_joined_extracted_prepared(tmp_path, capsys):
    """The 40 parts in --archive-dir: joined, unpacked, every <spk>/<video>/<n>.wav an utterance; without an
    archive dir the download step says how the audio is obtained."""
    have = tmp_path / "have"
    serve(have, {k: v for k, v in voxblink2_blobs().items() if k != "VB2_audio.tar.gz"})
    dl, raw, data = str(tmp_path / "dl"), str(tmp_path / "raw"), tmp_path / "data"
    assert voxblink2.main(["download", "--download-dir", dl, "--archive-dir", str(have)]) == 0
    assert voxblink2.main(["extract", "--download-dir", dl, "--archive-dir", str(have), "--raw-dir", raw]) == 0
    assert voxblink2.main(["prepare", "--raw-dir", raw, "--data", str(data)]) == 0
    vb2 = check_data_dir(data / "vb2")
    assert vb2.utts == sorted(u.replace("/", "-") for u in VOXBLINK2)
    assert vb2.utt2spk["id000000-a-b_c-d_e-f-00000"] == "id000000" and len(vb2.speakers) == 3
    assert "vb2 speakers: found 3, the published corpus has 111284" in capsys.readouterr().err
    assert voxblink2.main(["download", "--download-dir", dl]) == 2
    assert "sent by its authors on request" in capsys.readouterr().err
    assert voxblink2.main(["prepare", "--raw-dir", str(tmp_path / "none"), "--data", str(data)]) == 2
    assert f"expected folder {tmp_path / 'none'}/voxblink2/audio does not exist" in capsys.readouterr().err


# ---------------------------------------------------------------- MUSAN / RIRS_NOISES


def test_musan_rirs_prepare_on_the_synthetic_corpus(synth_corpus, tmp_path):
    corpus = tmp_path / "synth"
    shutil.copytree(synth_corpus, corpus)
    out = tmp_path / "lists"
    assert musan_rirs.main(["prepare", "--raw-dir", str(corpus), "--out", str(out)]) == 0
    for name, category in musan_rirs.MUSAN_LISTS.items():
        lines = [line.split() for line in (out / name).read_text().splitlines()]
        expected = sorted(p.stem for p in (corpus / "musan" / category).rglob("*.wav"))
        assert [u for u, _ in lines] == expected and all(os.path.isfile(p) and os.path.isabs(p) for _, p in lines)
    rirs = dict(line.split() for line in (out / "rirs.scp").read_text().splitlines())
    listed = [
        line.split()[1]
        for size in musan_rirs.ROOMS
        for line in (corpus / "RIRS_NOISES/simulated_rirs" / size / "rir_list").read_text().splitlines()
    ]
    assert sorted(rirs) == sorted(listed) and all(os.path.isfile(p) for p in rirs.values())
    assert "smallroom-Room001-00001" in rirs and "real" not in " ".join(rirs.values())
    shutil.rmtree(corpus / "musan" / "music")
    with pytest.raises(DatasetError, match=f"expected folder {corpus}/musan/music does not exist"):
        musan_rirs.prepare(corpus, out)


# ---------------------------------------------------------------- recipes


@pytest.mark.parametrize("recipe", ["voxceleb", "3dspeaker", "cnceleb", "voxblink2"])
def test_recipe_parses_and_prints_help(recipe):
    script = REPO / "egs" / recipe / "run.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    r = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "--stage" in r.stdout and "--gpus" in r.stdout and "--archive_dir" in r.stdout


def test_a_trial_list_that_fails_leaves_the_earlier_one_in_place(tmp_path):
    """A rerun whose official list names utterances the data dir lacks (a corpus partly extracted this time) is one
    error naming the line; the list an earlier run wrote is kept, and no temporary file is left beside it."""
    from speakerlab.datasets.common import DatasetError, write_trials

    utts = {"a-1", "a-2", "b-1"}
    path = tmp_path / "trials"
    assert write_trials(path, [("a-1", "a-2", True, 1), ("a-1", "b-1", False, 2)], utts, "official.txt") == 2
    before = path.read_text()
    with pytest.raises(DatasetError, match=r"official.txt:2: 'c-1' is not an utterance of"):
        write_trials(path, [("a-1", "a-2", True, 1), ("a-1", "c-1", False, 2)], utts, "official.txt")
    with pytest.raises(DatasetError, match="official.txt: no trials"):
        write_trials(path, [], utts, "official.txt")
    assert path.read_text() == before and sorted(p.name for p in tmp_path.iterdir()) == ["trials"]
