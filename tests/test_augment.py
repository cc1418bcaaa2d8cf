"""Augmentation: worker draws, the batched device path (SNR, reverb, speed) against the per-sample
reference, determinism across loader workers, config, and training with it."""

import contextlib

import numpy as np
import pytest
import torch

from speakerlab.config import ConfigError, load_config
from speakerlab.dataio.loaders.batches import CropDataset, GlobalBatchSampler, collate
from speakerlab.dataio.waveform.augment import EQ_HZ, INT16_SCALE, Augmenter, eq_curve, power, reference_wave
from speakerlab.dataio.waveform.noise_bank import NoiseBank, build_bank
from speakerlab.features.spec import KaldiFeatures
from speakerlab.frontends import FbankConfig
from speakerlab.train.build import build_inputs, build_net, class_names
from speakerlab.train.inputs.pipeline import InputPipeline
from speakerlab.train.loop import main as train_main
from speakerlab.train.losses.multicrop import cut_crops
from tests.helpers import losses, tiny_config, write_wav

SR = 16000
CROP = 4000


def decaying_rir(rng, delay, seconds=0.3):
    """A toy RIR: silence, a direct-path impulse at `delay`, then an exponentially decaying tail."""
    n = int(seconds * SR)
    rir = np.zeros(n)
    rir[delay] = 1.0
    t = np.arange(n - delay - 1) / SR
    rir[delay + 1 :] = 0.03 * rng.standard_normal(t.size) * np.exp(-t / 0.05)  # ~6 dB below the direct path
    return rir


def write_lists(root, files):
    root.mkdir(parents=True, exist_ok=True)
    for name, waves in files.items():
        lines = [
            f"{name[:-4]}-{i} {write_wav(root / 'wav' / f'{name[:-4]}-{i}.wav', w, subtype='FLOAT')}\n"
            for i, w in enumerate(waves)
        ]
        (root / name).write_text("".join(lines))
    return root


@pytest.fixture
def lists(tmp_path):
    """A musan_rirs-style lists dir: 2 noise (one shorter than the crops), 2 music, 4 speech, 2 RIRs."""
    rng = np.random.default_rng(0)
    files = {
        "noise.scp": [0.2 * rng.standard_normal(SR), 0.1 * rng.standard_normal(SR // 8)],
        "music.scp": [0.3 * np.sin(np.arange(2 * SR) * f / SR * 2 * np.pi) for f in (220, 330)],
        "babble.scp": [0.05 * (i + 1) * rng.standard_normal(SR) for i in range(4)],
        "rirs.scp": [decaying_rir(rng, 40), decaying_rir(rng, 90)],
    }
    return write_lists(tmp_path / "musan_rirs", files)


def bank_of(root, kinds=("reverb", "noise", "music", "babble")):
    return NoiseBank(build_bank(root, root / "bank", kinds, log=lambda m: None))


@pytest.fixture
def utts(tmp_path):
    rng = np.random.default_rng(1)
    return [str(write_wav(tmp_path / f"u{i}.wav", 0.1 * rng.standard_normal(SR))) for i in range(4)]


def dataset(utts, augmenter=None, speed=()):
    return CropDataset(utts, [0, 1, 2, 3], [SR] * 4, CROP, SR, augmenter, speed, 0.8 if speed else 0.0)


def pipeline(speed=(), num_speakers=None):
    return InputPipeline(KaldiFeatures(FbankConfig(), True), CROP, speed, num_speakers)


def batch_of(ds, seeds):
    items = [ds[(i % len(ds), int(s))] for i, s in enumerate(seeds)]
    return items, collate(items)


def clean(item):
    return item["wave"][:CROP].astype(np.float64) * INT16_SCALE


@pytest.mark.parametrize("kind,lo,hi", [("noise", 0, 15), ("music", 5, 15), ("babble", 13, 20)])
def test_mixed_snr_is_the_drawn_snr(lists, utts, kind, lo, hi):
    items, batch = batch_of(dataset(utts, Augmenter(bank_of(lists), prob=1.0, kinds=[kind])), range(12))
    y = pipeline().waves(batch).double().numpy()
    drawn = []
    for item, row in zip(items, y):
        d = item["picked"].draw
        assert d.kind == kind and row.shape == (CROP,)
        x = clean(item)
        assert 10 * np.log10(power(x) / power(row - x)) == pytest.approx(d.snr_db, abs=0.5)
        drawn.append(d.snr_db)
        if kind == "babble":
            assert 3 <= len(d.sources) <= 7  # 4 files listed: more talkers than that repeat files
    assert lo <= min(drawn) and max(drawn) <= hi and len(set(drawn)) == len(drawn)


def test_delta_rir_leaves_the_signal_unchanged(tmp_path, utts):
    rir = np.zeros(400)
    rir[123] = 0.5
    items, batch = batch_of(
        dataset(
            utts, Augmenter(bank_of(write_lists(tmp_path / "d", {"rirs.scp": [rir]}), ["reverb"]), 1.0, ["reverb"])
        ),
        range(4),
    )
    y = pipeline().waves(batch).double().numpy()
    for item, row in zip(items, y):
        assert item["picked"].draw.kind == "reverb"
        np.testing.assert_allclose(row, clean(item), atol=1e-6)


def test_the_equaliser_colours_each_crop_with_its_own_drawn_curve(lists, utts):
    ds = dataset(utts, Augmenter(bank_of(lists), prob=0.0, eq_prob=1.0, eq_db=8.0))
    items, batch = batch_of(ds, range(8))
    y = pipeline().waves(batch).double().numpy()
    freqs = np.fft.rfftfreq(CROP, 1 / 16000)
    gains = set()
    for item, row in zip(items, y):
        x, curve = clean(item), eq_curve(np.array(item["picked"].draw.eq_db), freqs)
        assert item["picked"].draw.kind is None and len(item["picked"].draw.eq_db) == len(EQ_HZ)
        assert power(row) == pytest.approx(power(x), rel=1e-4)
        # Every frequency bin of the crop is scaled by the drawn curve (up to one gain that keeps the power)
        sx, sy = np.abs(np.fft.rfft(x)), np.abs(np.fft.rfft(row))
        strong = sx > 0.1 * np.median(sx)
        residual = 20 * np.log10(sy[strong] / sx[strong]) - curve[strong]
        assert np.ptp(residual) < 0.05 and np.ptp(curve) > 10
        gains.add(item["picked"].draw.eq_db)
    assert len(gains) == 8  # a curve of its own for every crop


def test_reverb_keeps_length_power_and_alignment(lists, utts):
    items, batch = batch_of(dataset(utts, Augmenter(bank_of(lists), prob=1.0, kinds=["reverb"])), range(6))
    y = pipeline().waves(batch).double().numpy()
    for item, row in zip(items, y):
        x = clean(item)
        assert power(row) == pytest.approx(power(x), rel=1e-4) and np.abs(row - x).max() > 0.01
        # Aligned on the direct path: x is white, so only the lag-0 (direct) copy of it correlates
        # with x; a delay by the RIR's 40 or 90 leading zeros would leave almost no correlation.
        assert np.dot(x, row) / np.sqrt(np.dot(x, x) * np.dot(row, row)) > 0.7


def test_batched_device_path_equals_the_per_sample_reference(lists, utts):
    aug = Augmenter(bank_of(lists), prob=0.9, reverb_noise_prob=0.5, eq_prob=0.5)
    ds = dataset(utts, aug, speed=[0.9, 1.0, 1.1])
    items, batch = batch_of(ds, range(100, 140))
    y = pipeline(speed=[0.9, 1.1]).waves(batch).double().numpy()
    kinds, speeds, eq = set(), set(), set()
    for item, row in zip(items, y):
        ref = reference_wave(item["wave"], ds.factors[item["speed"]], CROP, item["picked"])
        # float32 on the device against the float64 reference, for crops of peak ~0.5.
        np.testing.assert_allclose(row, ref, atol=2e-5, rtol=0)
        kinds.add(item["picked"].draw.kind)
        speeds.add(item["speed"])
        eq.add(bool(item["picked"].draw.eq_db))
    assert {"reverb", "noise", "music", "babble", None} <= kinds and any(k and "+" in k for k in kinds)
    assert eq == {True, False}
    assert speeds == {0, 1, 2}


def test_draws_identical_for_any_number_of_workers(lists, utts):
    ds = dataset(utts, Augmenter(bank_of(lists), prob=1.0, reverb_noise_prob=0.5), speed=[0.9, 1.1])

    def batches(workers):
        sampler = GlobalBatchSampler(len(ds), 4, 2, 2, seed=3)
        sampler.set_epoch(1)
        loader = torch.utils.data.DataLoader(ds, batch_sampler=sampler, num_workers=workers, collate_fn=collate)
        return list(loader)

    a, b = batches(0), batches(2)
    assert len(a) == len(b) == 2
    for x, y in zip(a, b):
        assert list(map(repr, x["draws"])) == list(map(repr, y["draws"]))  # repr: nan != nan
        for key in ("wave", "label", "speed", "rir", "rir_item", "noise", "noise_item"):
            assert torch.equal(x[key], y[key]), key
        assert torch.equal(x["snr"].isnan(), y["snr"].isnan())
        assert torch.equal(x["snr"].nan_to_num(), y["snr"].nan_to_num())


def test_prob_zero_and_no_speed_leave_the_crop(lists, utts):
    items, batch = batch_of(dataset(utts, Augmenter(bank_of(lists), prob=0.0)), range(6))
    y = pipeline().waves(batch).double().numpy()
    for item, row in zip(items, y):
        assert item["picked"].draw.kind is None and np.array_equal(row, clean(item).astype(np.float32))
    # Augmentation draws after the crop: the crops are those of a dataset without augmentation.
    plain = dataset(utts)
    assert all(np.array_equal(it["wave"], plain[(i % 4, i)]["wave"]) for i, it in enumerate(items))


def test_perturbed_speaker_ids_and_classifier_size_agree(tmp_path, lists, utts):
    cfg, train = tiny_config(
        tmp_path, val=False, extra=f"augment: {{lists: {lists}, prob: 1.0, speed_prob: 1.0, reverb_noise_prob: 0.5}}"
    )
    config = load_config(cfg)
    speakers = ["s0", "s1", "s2", "s3"]
    names = class_names(config, speakers)
    assert names[:4] == speakers and names[4:8] == [f"sp0.9-{s}" for s in speakers] and len(names) == 12
    net = build_net(config, len(names), contextlib.nullcontext)
    assert net.classifier.weight.shape[0] == 12
    # One training step on CPU with speed + reverb + noise: labels index the expanded classes.
    aug = Augmenter(bank_of(lists), prob=1.0, reverb_noise_prob=0.5)
    pipe = build_inputs(config, KaldiFeatures(FbankConfig(), True), len(speakers))
    pipe.crop = CROP  # the tiny config's crop is 0.5 s; this dataset reads 0.25 s crops
    ds = CropDataset(utts, [0, 1, 2, 3], [SR] * 4, CROP, SR, aug, config.augment.speed_factors, 1.0)
    items, batch = batch_of(ds, range(8))
    feats, labels = pipe(batch)
    expected = [it["label"] + it["speed"] * 4 for it in items]
    assert labels.tolist() == expected and all(names[c].startswith("sp") for c in expected)
    loss, top1 = net(feats, labels)
    loss.backward()
    assert torch.isfinite(loss) and top1.shape == (8,) and net.classifier.weight.shape[0] == 12


BASE = "model:\n  name: campplus\ndata:\n  train: data/train\n"


def test_config_defaults_and_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(BASE)
    a = load_config(p).augment
    assert a.lists is None and a.prob == 0.6 and a.kinds == ["reverb", "noise", "music", "babble"]
    assert (a.noise_snr, a.music_snr, a.babble_snr, a.babble_speakers) == ([0, 15], [5, 15], [13, 20], [3, 7])
    assert a.bank is None and a.speed_factors == [0.9, 1.0, 1.1] and a.speed_prob == 0 and a.speed_new_speakers
    a = load_config(p, ["augment.lists=data/musan_rirs", "augment.kinds=[noise, music]", "augment.speed_prob=1"])
    assert a.augment.lists == "data/musan_rirs" and a.augment.kinds == ["noise", "music"]
    assert class_names(a, ["x"]) == ["x", "sp0.9-x", "sp1.1-x"]
    assert class_names(load_config(p, ["augment.speed_new_speakers=false", "augment.speed_prob=1"]), ["x"]) == ["x"]


@pytest.mark.parametrize(
    "text,match",
    [
        ("augment:\n  prob: 1.5\n", "config key 'augment.prob' must be in \\[0, 1\\]"),
        ("augment:\n  reverb_noise_prob: 2\n", "config key 'augment.reverb_noise_prob' must be in \\[0, 1\\]"),
        ("augment:\n  kinds: [noise, wind]\n", "config key 'augment.kinds' must list"),
        ("augment:\n  noise_snr: [15, 0]\n", "config key 'augment.noise_snr' must be \\[lo, hi\\]"),
        ("augment:\n  babble_speakers: [0, 3]\n", "config key 'augment.babble_speakers' must start at >= 1"),
        ("augment:\n  snr: [0, 15]\n", "unknown config key 'augment.snr'"),
        ("augment:\n  speed_prob: -0.1\n", "config key 'augment.speed_prob' must be in \\[0, 1\\]"),
        ("augment:\n  speed_factors: [0.9, 0]\n", "config key 'augment.speed_factors' must all be > 0"),
        ("augment:\n  speed_factors: [0.912345]\n", "config key 'augment.speed_factors' must be ratios of integers"),
        ("augment:\n  speed_factors: [1.0]\n  speed_prob: 0.5\n", "needs a factor other than 1"),
        ("augment:\n  speed_new_speakers: maybe\n", "config key 'augment.speed_new_speakers'"),
    ],
)
def test_bad_augment_config_names_the_key(tmp_path, text, match):
    p = tmp_path / "c.yaml"
    p.write_text(BASE + text)
    with pytest.raises(ConfigError, match=match):
        load_config(p)


@pytest.mark.slow  # a training run: 25 s; the fast lane trains in test_learning
def test_training_with_speed_and_augmentation(lists, tmp_path, capsys):
    extra = f"augment: {{lists: {lists}, prob: 1.0, speed_prob: 0.7, reverb_noise_prob: 0.5}}"
    cfg, _ = tiny_config(tmp_path, val=False, extra=extra)

    def train(exp, *overrides):
        return train_main(["--config", str(cfg), "--exp-dir", str(tmp_path / exp), "train.epochs=1", *overrides])

    assert train("a") == 0
    log = (tmp_path / "a" / "train.log").read_text()
    assert "no noise bank: building it" in log  # the first run builds <lists>/bank
    assert "augmentation with probability 1, one of: reverb (2 files), noise (2 files 0-15 dB)" in log
    ck = torch.load(tmp_path / "a" / "checkpoints" / "epoch_001.pt", map_location="cpu", weights_only=False)
    assert len(ck["speakers"]) == 12 and ck["classifier"]["weight"].shape[0] == 12
    # Loader workers draw nothing of their own: the losses match a run with worker processes.
    assert train("b", "hardware.num_workers=2") == 0
    assert "building it" not in (tmp_path / "b" / "train.log").read_text()  # the bank is reused
    a, b = losses(tmp_path / "a"), losses(tmp_path / "b")
    assert sorted(a) == [1, 2] and a == pytest.approx(b, rel=1e-5)
    (lists / "rirs.scp").write_text("r0 /no/such/rir.wav\n")
    assert train("c") == 2
    assert f"{lists / 'rirs.scp'}:1: /no/such/rir.wav does not exist" in capsys.readouterr().err
    assert not (tmp_path / "c" / "checkpoints").exists()


def test_each_crop_of_an_utterance_gets_its_own_augmentation(lists, utts):
    """DINO's crops (CropDataset augment_copies): every copy of an utterance is the same clean crop with its own
    noise at its own SNR, and a re-read of the item (any worker, a resume) draws them again alike."""
    aug = Augmenter(bank_of(lists), prob=1.0, kinds=["noise", "music", "babble"])
    ds = CropDataset(utts, [0, 1, 2, 3], [SR] * 4, CROP, SR, aug, augment_copies=6)
    items, batch = batch_of(ds, [11, 12])
    assert batch["copies"] == 6 and batch["snr"].shape == (12,)
    y = pipeline().waves(batch).double().view(6, 2, CROP).numpy()
    for i, item in enumerate(items):
        draws = [p.draw for p in item["picked"]]
        x = clean(item)
        added = y[:, i] - x
        for c in range(6):
            assert 10 * np.log10(power(x) / power(added[c])) == pytest.approx(draws[c].snr_db, abs=0.5)
            for other in range(c):
                assert np.abs(added[c] - added[other]).max() > 1e-3  # a different noise on every crop
        assert len({d.snr_db for d in draws}) == 6
    assert [p.draw for p in ds[(0, 11)]["picked"]] == [p.draw for p in items[0]["picked"]]
    assert [p.draw for p in ds[(0, 13)]["picked"]] != [p.draw for p in items[0]["picked"]]


def test_each_dino_crop_is_cut_from_its_own_copy():
    waves = torch.arange(3)[:, None, None] * 1000.0 + torch.arange(200.0).expand(3, 2, 200)  # (copies, B, N)
    index = torch.tensor([5, 9])
    crops = cut_crops(waves, index, 4, 0, 0, 3, 50).view(3, 2, 50)
    shared = cut_crops(waves[0], index, 4, 0, 0, 3, 50).view(3, 2, 50)
    for c in range(3):
        assert torch.all(crops[c] // 1000 == c)  # crop c from copy c
        torch.testing.assert_close(crops[c] - 1000 * c, shared[c])  # at the offsets of the shared wave


def test_disjoint_global_crops_share_no_sample_and_still_move_with_the_step():
    waves = torch.arange(200.0).expand(4, 200)  # (B, N): a sample's value is its position
    index = torch.arange(4) * 7
    starts = set()
    for step in range(20):
        crops = cut_crops(waves, index, step, 3, 0, 2, 60, disjoint=True).view(2, 4, 60)
        assert torch.all(crops[0] < 100) and torch.all(crops[1] >= 100)  # crop c within part c of the 200
        starts |= {int(x) for x in crops[:, :, 0].flatten()}
        again = cut_crops(waves, index, step, 3, 0, 2, 60, disjoint=True).view(2, 4, 60)
        torch.testing.assert_close(crops, again)  # a function of (seed, step, index, crop)
    assert len(starts) > 20  # every offset within [0, 40] of its part is drawn, not one fixed layout
    overlapping = cut_crops(waves, index, 0, 3, 0, 2, 60).view(2, 4, 60)
    assert torch.any(overlapping[0] >= 100) or torch.any(overlapping[1] < 100)  # off: anywhere in the 200
    with pytest.raises(ValueError, match="does not fit"):
        cut_crops(waves, index, 0, 3, 0, 2, 101, disjoint=True)


def test_the_input_pipeline_lives_where_its_front_end_was_built():
    """A GPU run builds the front end on the card and the pipeline around it: the batches must follow the front
    end there (the first run on a card crashed on a CPU-held pipeline feeding a window on the card). The meta
    device stands for the card."""
    from speakerlab.features.spec import KaldiFeatures
    from speakerlab.frontends import FbankConfig
    from speakerlab.train.inputs.pipeline import InputPipeline

    on_card = KaldiFeatures(FbankConfig(), True).to("meta")
    assert InputPipeline(on_card, 16000).device.type == "meta"
    assert InputPipeline(torch.nn.Identity(), 16000).device.type == "cpu"  # a front end without tensors
    assert InputPipeline(on_card, 16000).to_empty(device="cpu").device.type == "cpu"  # and moves with it
