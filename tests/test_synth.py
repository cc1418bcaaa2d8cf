"""The synthetic corpus writer (python -m speakerlab.synth) on a tiny corpus."""

import os

import numpy as np
import pytest
import soundfile as sf

from speakerlab.synth import voice
from speakerlab.synth.__main__ import main, parse_args, speaker_traits

MIN_DUR, MAX_DUR = 0.5, 1.0  # train utterances
EVAL_MIN_DUR, EVAL_MAX_DUR = 1.1, 1.4  # val / test utterances
TINY = [
    "--num-train-speakers",
    "4",
    "--num-val-speakers",
    "2",
    "--num-test-speakers",
    "3",
    "--utts-per-speaker",
    "3",
    "--eval-utts-per-speaker",
    "3",
    "--min-dur",
    str(MIN_DUR),
    "--max-dur",
    str(MAX_DUR),
    "--eval-min-dur",
    str(EVAL_MIN_DUR),
    "--eval-max-dur",
    str(EVAL_MAX_DUR),
    "--seed",
    "7",
]


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """The same tiny corpus written with 1 and with 2 worker processes."""
    one = tmp_path_factory.mktemp("synth") / "one"
    two = tmp_path_factory.mktemp("synth") / "two"
    assert main(["--out", str(one), "--jobs", "1", *TINY]) == 0
    assert main(["--out", str(two), "--jobs", "2", *TINY]) == 0
    return str(one), str(two)


def _read(path):
    with open(path) as f:
        return [line.split() for line in f.read().splitlines()]


def _files(root):
    out = []
    for d, _, names in os.walk(root):
        out += [os.path.relpath(os.path.join(d, n), root) for n in names]
    return sorted(out)


def test_lists_are_consistent(corpora):
    out = corpora[0]
    seen_speakers = []
    for name, n_spk in (("train", 4), ("val", 2), ("test", 3)):
        d = os.path.join(out, name)
        wav, u2s, s2u = (_read(os.path.join(d, f)) for f in ("wav.scp", "utt2spk", "spk2utt"))
        assert len(wav) == len(u2s) == 3 * n_spk and len(s2u) == n_spk
        for lines in (wav, u2s, s2u):
            assert [x[0] for x in lines] == sorted(x[0] for x in lines)
        assert [x[0] for x in wav] == [x[0] for x in u2s]
        utt2spk = {u: s for u, s in u2s}
        assert all(u.startswith(s + "-") for u, s in utt2spk.items())
        # spk2utt is exactly the inverse of utt2spk.
        assert {(u, x[0]) for x in s2u for u in x[1:]} == set(utt2spk.items())
        for utt, path in wav:
            assert os.path.isabs(path) and os.path.isfile(path)
            assert path == os.path.join(out, "wav", name, utt2spk[utt], utt + ".wav")
        seen_speakers.append(set(utt2spk.values()))
        if name != "train":
            trials = _read(os.path.join(d, "trials"))
            assert trials == sorted(trials) and len({tuple(t) for t in trials}) == len(trials)
            assert all(a in utt2spk and b in utt2spk and a != b for a, b, _ in trials)
            labels = [lab for _, _, lab in trials]
            assert set(labels) == {"target", "nontarget"}
            assert all((utt2spk[a] == utt2spk[b]) == (lab == "target") for a, b, lab in trials)
            assert labels.count("nontarget") >= labels.count("target")
    train, val, test = seen_speakers
    assert not (train & val or train & test or val & test)


def test_audio_format_and_duration(corpora):
    for name in ("train", "val", "test"):
        lo, hi = (MIN_DUR, MAX_DUR) if name == "train" else (EVAL_MIN_DUR, EVAL_MAX_DUR)
        for _, path in _read(os.path.join(corpora[0], name, "wav.scp")):
            info = sf.info(path)
            assert (info.samplerate, info.channels, info.subtype, info.format) == (16000, 1, "PCM_16", "WAV")
            assert lo <= info.frames / 16000 <= hi
    x, _ = sf.read(path, dtype="int16")
    assert np.abs(x).max() > 100  # not silence


def test_identical_bytes_for_any_number_of_jobs(corpora):
    one, two = corpora
    assert _files(one) == _files(two)
    for rel in _files(one):
        with open(os.path.join(one, rel), "rb") as f:
            a = f.read()
        with open(os.path.join(two, rel), "rb") as f:
            b = f.read()
        if rel.endswith("wav.scp"):  # absolute paths: equal once the output dir is swapped
            a = a.replace(one.encode(), two.encode())
        assert a == b, rel


def test_noise_and_rir_layout(corpora):
    out = corpora[0]
    for sub in ("noise/free-sound", "music/fma", "speech/librivox"):
        wavs = [n for n in os.listdir(os.path.join(out, "musan", sub)) if n.endswith(".wav")]
        assert wavs and all(n.startswith(sub.replace("/", "-")) for n in wavs)
    assert os.path.isfile(os.path.join(out, "musan/noise/free-sound/noise-free-sound-0000.wav"))
    sim = os.path.join(out, "RIRS_NOISES", "simulated_rirs")
    for size in ("smallroom", "mediumroom", "largeroom"):
        assert os.path.isfile(os.path.join(sim, size, "Room001", "Room001-00001.wav"))
        lines = _read(os.path.join(sim, size, "rir_list"))
        assert lines
        for opt1, rir_id, opt2, room_id, rel in lines:
            assert (opt1, opt2) == ("--rir-id", "--room-id") and rir_id.startswith(room_id)
            assert os.path.isfile(os.path.join(out, rel))  # paths relative to the corpus dir
        h, sr = sf.read(os.path.join(out, lines[0][-1]))
        assert sr == 16000 and np.argmax(np.abs(h)) < 0.07 * sr  # direct path or early part first
    real = os.path.join(out, "RIRS_NOISES", "real_rirs_isotropic_noises")
    for lst in ("rir_list", "noise_list"):
        for line in _read(os.path.join(real, lst)):
            assert os.path.isfile(os.path.join(out, line[-1]))


def test_speakers_have_distinct_traits():
    vectors = np.stack([speaker_traits(7, i).vector() for i in range(8)])
    assert np.array_equal(vectors[0], speaker_traits(7, 0).vector())  # deterministic
    for i in range(8):
        for j in range(i):
            assert not np.allclose(vectors[i], vectors[j])
    assert not np.allclose(speaker_traits(8, 0).vector(), vectors[0])  # the seed matters


@pytest.mark.parametrize("num_samples", [12345, 1600])  # 1600: shorter than the lead-in silence
def test_utterance_shape_and_level(num_samples):
    traits = speaker_traits(7, 0)
    rng = np.random.default_rng(0)
    x = voice.synth_utterance(traits, num_samples, rng, voice.draw_session(rng))
    assert x.shape == (num_samples,) and x.dtype == np.float32
    assert np.all(np.isfinite(x)) and np.abs(x).max() <= 0.99 and np.abs(x).max() > 0.01


def test_rerun_is_skipped_and_changed_options_rewrite(tmp_path):
    out = str(tmp_path / "c")
    small = [
        "--num-train-speakers",
        "1",
        "--num-val-speakers",
        "2",
        "--num-test-speakers",
        "2",
        "--utts-per-speaker",
        "2",
        "--eval-utts-per-speaker",
        "2",
        "--min-dur",
        "0.3",
        "--max-dur",
        "0.3",
        "--eval-min-dur",
        "0.3",
        "--eval-max-dur",
        "0.3",
    ]
    assert main(["--out", out, *small]) == 0
    scp = os.path.join(out, "train", "wav.scp")
    stamp = os.stat(scp).st_mtime_ns
    assert main(["--out", out, *small]) == 0
    assert os.stat(scp).st_mtime_ns == stamp  # same options: nothing rewritten
    small[7] = "1"  # one train utterance per speaker
    assert main(["--out", out, *small]) == 0
    assert len(_read(scp)) == 1
    assert not os.path.exists(os.path.join(out, "wav", "train", "spk0000", "spk0000-0001.wav"))


@pytest.mark.parametrize(
    "bad, message",
    [
        (["--min-dur", "3", "--max-dur", "2"], "need 0.1 <= --min-dur <= --max-dur, got 3.0, 2.0"),
        (["--eval-min-dur", "9"], "need 0.1 <= --eval-min-dur <= --eval-max-dur, got 9.0, 8.0"),
        (["--num-test-speakers", "1"], "val and test need >= 2 speakers with >= 2 utterances"),
        (["--jobs", "0"], "--jobs must be >= 1"),
    ],
)
def test_bad_options_are_refused(bad, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(["--out", str(tmp_path), *bad])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing generated
