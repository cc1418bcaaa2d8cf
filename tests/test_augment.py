"""Training augmentation: SNRs, reverberation, determinism, list errors, config, dataset, training."""
import numpy as np
import pytest

from speakerlab.augment import Augmenter, power
from speakerlab.batches import CropDataset
from speakerlab.config import ConfigError, load_config
from speakerlab.lists import ListError
from speakerlab.train import main as train_main
from tests.helpers import write_wav
from tests.test_train import losses, tiny_config

SR = 16000


def decaying_rir(rng, delay, seconds=0.3):
    """A toy RIR: silence, a direct-path impulse at `delay`, then an exponentially decaying tail."""
    n = int(seconds * SR)
    rir = np.zeros(n)
    rir[delay] = 1.0
    t = np.arange(n - delay - 1) / SR
    rir[delay + 1:] = 0.03 * rng.standard_normal(t.size) * np.exp(-t / 0.05)  # ~6 dB below the direct path
    return rir


@pytest.fixture
def lists(tmp_path):
    """A musan_rirs-style lists dir: 2 noise (one shorter than the crops), 2 music, 4 speech, 2 RIRs."""
    rng = np.random.default_rng(0)
    root, wav = tmp_path / "musan_rirs", tmp_path / "wav"
    root.mkdir()
    files = {"noise.scp": [0.2 * rng.standard_normal(SR), 0.1 * rng.standard_normal(SR // 4)],
             "music.scp": [0.3 * np.sin(np.arange(2 * SR) * f / SR * 2 * np.pi) for f in (220, 330)],
             "babble.scp": [0.05 * (i + 1) * rng.standard_normal(SR) for i in range(4)],
             "rirs.scp": [decaying_rir(rng, 40), decaying_rir(rng, 90)]}
    for name, waves in files.items():
        lines = [f"{name[:-4]}-{i} {write_wav(wav / f'{name[:-4]}-{i}.wav', w, subtype='FLOAT')}\n"
                 for i, w in enumerate(waves)]
        (root / name).write_text("".join(lines))
    return root


def speech(seed=1, n=SR // 2):
    return (0.1 * np.random.default_rng(seed).standard_normal(n)).astype(np.float32)


@pytest.mark.parametrize("kind,lo,hi", [("noise", 0, 15), ("music", 5, 15), ("babble", 13, 20)])
def test_added_signal_has_the_drawn_snr(lists, kind, lo, hi):
    aug = Augmenter(lists, prob=1.0, kinds=[kind])
    x = speech()
    drawn = []
    for seed in range(8):
        y, applied = aug.apply(x, np.random.default_rng(seed))
        assert applied.kind == kind and y.shape == x.shape and y.dtype == np.float32
        measured = 10 * np.log10(power(x) / power(y.astype(np.float64) - x))
        assert measured == pytest.approx(applied.snr_db, abs=0.01)
        drawn.append(applied.snr_db)
        if kind == "babble":
            assert 3 <= len(applied.files) <= 7  # 4 files listed: more talkers than that repeat files
    assert lo <= min(drawn) and max(drawn) <= hi and len(set(drawn)) == len(drawn)


def test_snr_ranges_are_configurable(lists):
    aug = Augmenter(lists, prob=1.0, kinds=["noise"], snr={"noise": (-5, -5)})
    x = speech()
    y, applied = aug.apply(x, np.random.default_rng(3))
    assert applied.snr_db == -5
    assert 10 * np.log10(power(x) / power(y.astype(np.float64) - x)) == pytest.approx(-5, abs=0.01)


def test_reverb_keeps_length_and_power(lists):
    aug = Augmenter(lists, prob=1.0, kinds=["reverb"])
    x = speech()
    for seed in range(4):
        y, applied = aug.apply(x, np.random.default_rng(seed))
        assert applied.kind == "reverb" and y.shape == x.shape and y.dtype == np.float32
        assert power(y) == pytest.approx(power(x), rel=1e-5)
        assert np.abs(y - x).max() > 0.01
        # Aligned on the direct path: x is white, so only the lag-0 (direct) copy of it correlates
        # with x; a delay by the RIR's 40 or 90 leading zeros would leave almost no correlation.
        assert np.dot(x, y) / np.sqrt(np.dot(x, x) * np.dot(y, y)) > 0.7


def test_reverb_with_a_delayed_impulse_returns_the_input(tmp_path):
    rir = np.zeros(400)
    rir[123] = 0.5
    (tmp_path / "rirs.scp").write_text(f"r1 {write_wav(tmp_path / 'r1.wav', rir, subtype='FLOAT')}\n")
    x = speech()
    y = Augmenter(tmp_path, prob=1.0, kinds=["reverb"])(x, np.random.default_rng(0))
    np.testing.assert_allclose(y, x, atol=1e-6)


def test_reverb_then_noise(lists, tmp_path):
    """reverb_noise_prob=1: every reverberated crop also gets an additive kind, at the drawn SNR
    against the reverberant speech; the additive crops and reverb-only set-ups are unchanged."""
    # An impulse RIR leaves the speech as it was, so the added noise can be measured against x.
    rir = np.zeros(400)
    rir[50] = 1.0
    root = tmp_path / "impulse"
    root.mkdir()
    (root / "rirs.scp").write_text(f"r {write_wav(tmp_path / 'r.wav', rir, subtype='FLOAT')}\n")
    (root / "noise.scp").write_text((lists / "noise.scp").read_text())
    x = speech()
    both = Augmenter(root, prob=1.0, kinds=["reverb", "noise"], reverb_noise_prob=1.0)
    plain = Augmenter(root, prob=1.0, kinds=["reverb", "noise"])
    kinds = set()
    for seed in range(12):
        y, applied = both.apply(x, np.random.default_rng(seed))
        y0, applied0 = plain.apply(x, np.random.default_rng(seed))
        kinds.add(applied.kind)
        if applied.kind == "reverb+noise":
            assert applied0.kind == "reverb" and len(applied.files) == 2
            np.testing.assert_allclose(y0, x, atol=1e-6)
            measured = 10 * np.log10(power(x) / power(y.astype(np.float64) - x))
            assert measured == pytest.approx(applied.snr_db, abs=0.01)
        else:  # additive crops do not depend on the option
            assert applied.kind == applied0.kind == "noise" and np.array_equal(y, y0)
    assert kinds == {"reverb+noise", "noise"}
    # With no additive kind enabled the option draws nothing: plain reverb, the same output.
    only = [Augmenter(root, prob=1.0, kinds=["reverb"], reverb_noise_prob=p) for p in (0.0, 1.0)]
    for seed in range(4):
        a, b = (o.apply(x, np.random.default_rng(seed)) for o in only)
        assert a[1].kind == b[1].kind == "reverb" and np.array_equal(a[0], b[0])


def test_same_seed_same_output_other_seed_differs(lists):
    aug = Augmenter(lists, prob=1.0)
    x = speech()
    outs = [aug(x, np.random.default_rng(seed)) for seed in range(6)]
    again = [Augmenter(lists, prob=1.0)(x, np.random.default_rng(seed)) for seed in range(6)]
    for a, b in zip(outs, again):
        np.testing.assert_array_equal(a, b)
    for i in range(1, 6):
        assert not np.array_equal(outs[0], outs[i])


def test_prob_zero_leaves_the_input(lists):
    aug = Augmenter(lists, prob=0.0)
    x = speech()
    for seed in range(10):
        y, applied = aug.apply(x, np.random.default_rng(seed))
        assert applied.kind is None and np.array_equal(y, x)


def test_list_problems_are_reported_at_once_with_lines(lists, tmp_path):
    noise = lists / "noise.scp"
    noise.write_text(noise.read_text() + "gone /no/such/noise.wav\n")
    (lists / "music.scp").write_text("just-one-field\n" + (lists / "music.scp").read_text())
    write_wav(tmp_path / "narrow.wav", np.zeros(800), sample_rate=8000)
    (lists / "babble.scp").write_text(f"narrow {tmp_path / 'narrow.wav'}\n" + (lists / "babble.scp").read_text())
    (lists / "rirs.scp").unlink()
    with pytest.raises(ListError) as e:
        Augmenter(lists)
    msg = str(e.value)
    assert "4 problem(s)" in msg
    assert f"{noise}:3: /no/such/noise.wav does not exist" in msg
    assert f"{lists / 'music.scp'}:1: expected 2..n fields, got 1" in msg
    assert f"{lists / 'babble.scp'}:1: {tmp_path / 'narrow.wav'}: sample rate 8000 Hz" in msg
    assert f"{lists / 'rirs.scp'}: list does not exist" in msg
    with pytest.raises(ListError, match="1 problem"):  # only the enabled kinds' lists are read
        Augmenter(lists, kinds=["noise"])


BASE = "model:\n  name: campplus\ndata:\n  train: data/train\n"


def test_config_defaults_and_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(BASE)
    a = load_config(p).augment
    assert a.lists is None and a.prob == 0.6 and a.kinds == ["reverb", "noise", "music", "babble"]
    assert (a.noise_snr, a.music_snr, a.babble_snr, a.babble_speakers) == ([0, 15], [5, 15], [13, 20], [3, 7])
    a = load_config(p, ["augment.lists=data/musan_rirs", "augment.kinds=[noise, music]", "augment.prob=1"]).augment
    assert a.lists == "data/musan_rirs" and a.kinds == ["noise", "music"] and a.prob == 1.0


@pytest.mark.parametrize("text,match", [
    ("augment:\n  prob: 1.5\n", "config key 'augment.prob' must be in \\[0, 1\\]"),
    ("augment:\n  reverb_noise_prob: 2\n", "config key 'augment.reverb_noise_prob' must be in \\[0, 1\\]"),
    ("augment:\n  kinds: [noise, wind]\n", "config key 'augment.kinds' must list"),
    ("augment:\n  kinds: []\n", "config key 'augment.kinds' must list"),
    ("augment:\n  noise_snr: [15, 0]\n", "config key 'augment.noise_snr' must be \\[lo, hi\\]"),
    ("augment:\n  music_snr: [5]\n", "config key 'augment.music_snr' must be \\[lo, hi\\]"),
    ("augment:\n  babble_snr: [13, loud]\n", "config key 'augment.babble_snr\\[1\\]' must be a number"),
    ("augment:\n  babble_speakers: [0, 3]\n", "config key 'augment.babble_speakers' must start at >= 1"),
    ("augment:\n  babble_speakers: [3, 7.5]\n", "config key 'augment.babble_speakers\\[1\\]' must be an integer"),
    ("augment:\n  lists: 3\n", "config key 'augment.lists'"),
    ("augment:\n  snr: [0, 15]\n", "unknown config key 'augment.snr'"),
])
def test_bad_augment_config_names_the_key(tmp_path, text, match):
    p = tmp_path / "c.yaml"
    p.write_text(BASE + text)
    with pytest.raises(ConfigError, match=match):
        load_config(p)


def test_crop_dataset_augments_deterministically(lists, tmp_path):
    paths = [str(write_wav(tmp_path / f"u{i}.wav", speech(i, 8000))) for i in range(2)]
    plain = CropDataset(paths, [0, 1], [8000, 8000], crop_samples=3000)
    ds = CropDataset(paths, [0, 1], [8000, 8000], crop_samples=3000, augment=Augmenter(lists, prob=1.0))
    a, label, index = ds[(1, 77)]
    b, _, _ = ds[(1, 77)]
    c, _, _ = ds[(1, 78)]
    assert a.shape == (3000,) and label == 1 and index == 1
    assert np.array_equal(a.numpy(), b.numpy()) and not np.array_equal(a.numpy(), c.numpy())
    assert not np.array_equal(a.numpy(), plain[(1, 77)][0].numpy())
    # The crop itself is drawn first from the same generator: prob 0 gives the plain crop.
    off = CropDataset(paths, [0, 1], [8000, 8000], crop_samples=3000, augment=Augmenter(lists, prob=0.0))
    assert np.array_equal(off[(1, 77)][0].numpy(), plain[(1, 77)][0].numpy())


def test_training_with_augmentation(lists, tmp_path, capsys):
    cfg, _ = tiny_config(tmp_path, val=False, extra=f"augment: {{lists: {lists}, prob: 1.0}}")
    def train(exp, *overrides):
        return train_main(["--config", str(cfg), "--exp-dir", str(tmp_path / exp), "train.epochs=1", *overrides])

    assert train("a") == 0
    log = (tmp_path / "a" / "train.log").read_text()
    assert "augmentation with probability 1, one of: reverb (2 files), noise (2 files 0-15 dB)" in log
    # Loader workers draw nothing of their own: the losses match a run with worker processes.
    assert train("b", "hardware.num_workers=2") == 0
    a, b = losses(tmp_path / "a"), losses(tmp_path / "b")
    assert sorted(a) == [1, 2] and a == pytest.approx(b, rel=1e-6)
    (lists / "rirs.scp").write_text("r0 /no/such/rir.wav\n")
    assert train("c") == 2
    assert f"{lists / 'rirs.scp'}:1: /no/such/rir.wav does not exist" in capsys.readouterr().err
    assert not (tmp_path / "c" / "checkpoints").exists()
