"""The memory-mapped noise / RIR bank: contents, problems reported at once, staleness, sharing."""

import json
import pickle

import numpy as np
import pytest

from speakerlab.dataio.waveform.noise_bank import AUDIO, BankError, NoiseBank, bank_problem, build_bank, main
from tests.helpers import write_wav

SR = 16000


@pytest.fixture
def lists(tmp_path):
    """noise (2 files, one shorter than a crop), music, babble, rirs lists; float files."""
    rng = np.random.default_rng(0)
    root = tmp_path / "lists"
    root.mkdir()
    files = {
        "noise.scp": [0.2 * rng.standard_normal(SR), 0.1 * rng.standard_normal(SR // 4)],
        "music.scp": [0.3 * np.sin(np.arange(SR) * 220 / SR * 2 * np.pi)],
        "babble.scp": [0.05 * rng.standard_normal(SR)],
        "rirs.scp": [np.r_[np.zeros(30), 1.0, 0.1 * rng.standard_normal(200)]],
    }
    for name, waves in files.items():
        lines = [
            f"{name[:-4]}-{i} {write_wav(tmp_path / 'wav' / f'{name[:-4]}-{i}.wav', w, subtype='FLOAT')}\n"
            for i, w in enumerate(waves)
        ]
        (root / name).write_text("".join(lines))
    return root, files


def test_bank_holds_every_file_as_scaled_int16(lists, tmp_path):
    root, files = lists
    out = build_bank(root, tmp_path / "bank", log=lambda m: None)
    bank = NoiseBank(out)
    assert {k: bank.count(k) for k in ("noise", "music", "babble", "reverb")} == {
        "noise": 2,
        "music": 1,
        "babble": 1,
        "reverb": 1,
    }
    assert bank.audio.dtype == np.int16 and bank.audio.shape == (sum(w.size for v in files.values() for w in v),)
    scales = json.loads((out / "index.json").read_text())["kinds"]["noise"]["scales"]
    for i, wave in enumerate(files["noise.scp"]):
        seg = bank.segment("noise", i)
        assert np.abs(seg).max() == 32767  # scaled to the int16 peak
        # float32 file -> int16: the rounding error is half a step of the file's own peak / 32767.
        np.testing.assert_allclose(seg * scales[i], wave.astype(np.float32), atol=0.51 * scales[i])
    assert bank_problem(out, root, ["noise", "reverb"], SR) is None


def test_a_rerun_over_the_same_lists_builds_nothing_and_a_changed_list_rebuilds(lists, tmp_path):
    """The recipes build the bank at every run of their preparing stage: the same lists leave it as it is (its audio
    file untouched), another kind set or a changed list builds it again."""
    root, _ = lists
    said = []
    out = build_bank(root, tmp_path / "bank", log=said.append)
    stamp = (out / "audio.npy").stat().st_mtime_ns
    build_bank(root, out, log=said.append)
    assert said[-1].endswith("nothing to do") and (out / "audio.npy").stat().st_mtime_ns == stamp
    build_bank(root, out, kinds=["noise"], log=said.append)
    assert not said[-1].endswith("nothing to do") and NoiseBank(out).count("noise") == 2
    with open(root / "noise.scp") as f:
        first = f.readline()
    (root / "noise.scp").write_text(first)  # one noise file left in the list
    build_bank(root, out, kinds=["noise"], log=said.append)
    assert not said[-1].endswith("nothing to do") and NoiseBank(out).count("noise") == 1


def test_crops_repeat_short_files_and_follow_the_generator(lists, tmp_path):
    bank = NoiseBank(build_bank(lists[0], tmp_path / "bank", log=lambda m: None))
    short = bank.segment("noise", 1)  # SR // 4 samples
    crop = bank.crop("noise", 1, SR, np.random.default_rng(5))
    start = int(np.random.default_rng(5).integers(0, short.shape[0]))
    assert crop.shape == (SR,) and np.array_equal(crop, np.tile(short, 6)[start : start + SR])
    a, b = (bank.crop("noise", 0, 4000, np.random.default_rng(9)) for _ in range(2))
    assert np.array_equal(a, b)


def test_every_problem_is_reported_with_list_and_line(lists, tmp_path):
    root, _ = lists
    bad = tmp_path / "bad"
    write_wav(bad / "narrow.wav", np.zeros(800) + 0.1, sample_rate=8000)
    write_wav(bad / "empty.wav", np.zeros(0))
    write_wav(bad / "silent.wav", np.zeros(SR))
    (bad / "garbage.wav").write_bytes(b"RIFF not really a wave file")
    noise = root / "noise.scp"
    noise.write_text(noise.read_text() + f"gone /no/such.wav\nnarrow {bad / 'narrow.wav'}\nempty {bad / 'empty.wav'}\n")
    music = root / "music.scp"
    music.write_text(f"silent {bad / 'silent.wav'}\njust-one-field\n")
    (root / "babble.scp").write_text(f"garbage {bad / 'garbage.wav'}\n")
    (root / "rirs.scp").unlink()
    with pytest.raises(BankError) as e:
        build_bank(root, tmp_path / "bank", log=lambda m: None)
    msg = str(e.value)
    assert "6 problem(s)" in msg and "no bank written" in msg
    assert f"{noise}:3: /no/such.wav does not exist" in msg
    assert f"{noise}:4: {bad / 'narrow.wav'}: sample rate 8000 Hz" in msg
    assert f"{noise}:5: {bad / 'empty.wav'}: empty audio file" in msg
    assert f"{music}:2: expected 2..n fields" in msg  # a malformed list is one problem, read no further
    assert f"{root / 'babble.scp'}:1: {bad / 'garbage.wav'}: cannot open audio" in msg
    assert f"{root / 'rirs.scp'}: list does not exist" in msg
    assert not (tmp_path / "bank" / AUDIO).exists()
    music.write_text(f"silent {bad / 'silent.wav'}\n")
    with pytest.raises(BankError, match=f"{music}:1: {bad / 'silent.wav'}: silent audio file"):
        build_bank(root, tmp_path / "bank", kinds=["music"], log=lambda m: None)


def test_changed_list_makes_the_bank_stale(lists, tmp_path):
    root, _ = lists
    out = build_bank(root, tmp_path / "bank", kinds=["noise"], log=lambda m: None)
    assert bank_problem(out, root, ["noise"], SR) is None
    assert "has no music audio" in bank_problem(out, root, ["noise", "music"], SR)
    assert "sample rate" in bank_problem(out, root, ["noise"], 8000)
    (root / "noise.scp").write_text((root / "noise.scp").read_text().splitlines()[0] + "\n")
    assert "noise.scp changed since the bank was built" in bank_problem(out, root, ["noise"], SR)
    assert "no noise bank" in bank_problem(tmp_path / "nowhere", root, ["noise"], SR)


def test_workers_get_the_bank_without_its_audio(lists, tmp_path):
    bank = NoiseBank(build_bank(lists[0], tmp_path / "bank", log=lambda m: None))
    assert isinstance(bank.audio, np.memmap)  # opened read-only from the file, not loaded
    shipped = pickle.dumps(bank)
    assert len(shipped) < 4096  # the index only: each worker maps the file itself (shared page cache)
    again = pickle.loads(shipped)
    assert again._audio is None and np.array_equal(again.segment("music", 0), bank.segment("music", 0))


def test_command_line(lists, tmp_path, capsys):
    root, _ = lists
    assert main(["--lists", str(root), "--kinds", "noise", "music"]) == 0
    assert (root / "bank" / AUDIO).is_file() and "noise 2 files, music 1 files" in capsys.readouterr().out
    (root / "music.scp").write_text("m /no/such.wav\n")
    assert main(["--lists", str(root), "--out", str(tmp_path / "b2")]) == 2
    assert f"{root / 'music.scp'}:1: /no/such.wav does not exist" in capsys.readouterr().err
