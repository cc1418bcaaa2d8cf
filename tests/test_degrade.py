"""Degradations of the stress table: each condition changes the audio as its name says, repeatably."""

import numpy as np
import pytest

from speakerlab.dataio.waveform.augment import power
from speakerlab.dataio.waveform.degrade import (
    CODECS,
    DEFAULT_CONDITIONS,
    ConditionError,
    Step,
    check_conditions,
    codec,
    codec_problem,
    degrade,
    parse_condition,
    rng_for,
    telephone,
)
from tests.test_augment import bank_of, lists  # noqa: F401 (the lists fixture)

SR = 16000


def speechlike(seconds=3.0, seed=0):
    """Voiced-speech-like audio with energy up to 8 kHz: a 120-180 Hz pulse train with a wandering pitch,
    shaped by moving formant-like resonances, plus breath noise, syllable-rate amplitude modulation."""
    rng = np.random.default_rng(seed)
    n = int(seconds * SR)
    t = np.arange(n) / SR
    f0 = 150 + 30 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / SR
    harmonics = sum(np.sin(k * phase) * np.exp(-k / 25) for k in range(1, 50))
    x = harmonics * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t)) + 0.05 * rng.standard_normal(n)
    return (0.2 * x / np.max(np.abs(x))).astype(np.float32)


def band_energy(x, lo, hi):
    spec = np.abs(np.fft.rfft(x.astype(np.float64))) ** 2
    f = np.fft.rfftfreq(x.shape[0], 1 / SR)
    return spec[(f >= lo) & (f < hi)].sum()


def test_telephone_removes_the_energy_outside_300_3400_hz():
    x = np.random.default_rng(0).standard_normal(2 * SR).astype(np.float32) * 0.1  # flat to 8 kHz
    y = telephone(x, SR)
    assert y.shape == x.shape and y.dtype == np.float32
    # Above 3.4 kHz: 54% of white noise's energy before, < 0.01% of it after (-40 dB and more).
    assert band_energy(y, 3500, 8000) < 1e-4 * band_energy(x, 3500, 8000)
    assert band_energy(y, 0, 250) < 1e-3 * band_energy(x, 0, 250)
    # ... and the pass band survives (within 1 dB).
    assert 0.8 < band_energy(y, 400, 3300) / band_energy(x, 400, 3300) < 1.25


def coding_error(x, kind):
    """Relative error of `kind`'s output against its input as the coder sees it (the telephone band for
    the 8 kHz codecs), with the output and that reference."""
    y = codec(x, SR, kind)
    ref = telephone(x, SR) if CODECS[kind][2] == 8000 else x
    return power(y - ref) / power(ref), y, ref


@pytest.mark.parametrize("kind", sorted(CODECS))
def test_each_codec_is_really_applied(kind):
    if codec_problem(kind):
        pytest.skip(codec_problem(kind))
    x = speechlike()
    err, y, ref = coding_error(x, kind)
    assert y.shape == x.shape and y.dtype == np.float32
    corr = float(np.dot(ref, y) / np.sqrt(power(ref) * power(y)) / x.shape[0])
    # The voice is still there (correlated and aligned: no codec delay left) but coded, with an error
    # far above float rounding (1e-14): mu-law's 8-bit steps, more for the 13 / 8 / 20 kbit/s codecs.
    assert corr > 0.5, (kind, corr)
    assert err > 1e-5, (kind, err)
    if CODECS[kind][2] == 8000:  # narrow band: nothing above 4 kHz (-30 dB: the resampler's stop band)
        assert band_energy(y, 4100, 8000) < 1e-3 * band_energy(x, 4100, 8000)
    if kind != "ulaw":
        assert err > 10 * coding_error(x, "ulaw")[0], (kind, err)


def test_truncation_crops_the_stated_duration_at_a_seeded_start():
    x = speechlike(4.0)
    y = degrade(x, SR, "trunc1.5", rng_for("utt1", "trunc1.5", 3))
    assert y.shape == (int(1.5 * SR),)
    start = [s for s in range(x.shape[0] - y.shape[0] + 1) if x[s] == y[0] and np.array_equal(x[s : s + 24000], y)]
    assert len(start) == 1
    starts = {int(np.flatnonzero(x == degrade(x, SR, "trunc1", rng_for(f"u{i}", "trunc1", 3))[0])[0]) for i in range(8)}
    assert len(starts) > 4  # the start depends on the utterance
    short = speechlike(0.5)
    assert np.array_equal(degrade(short, SR, "trunc1", rng_for("u", "trunc1", 0)), short)


def test_repetition_pads_short_audio_to_the_stated_duration_and_keeps_longer():
    """repN, the short-input policy as a condition: a 0.7 s crop repeated to 2 s is the crop, then the crop
    again, then its first 0.6 s (never zeros); audio already longer is untouched."""
    x = speechlike(4.0)
    crop = degrade(x, SR, "trunc0.7", rng_for("u", "trunc0.7+rep2", 1))
    y = degrade(x, SR, "trunc0.7+rep2", rng_for("u", "trunc0.7+rep2", 1))
    assert y.shape == (2 * SR,) and crop.shape == (int(0.7 * SR),)
    assert np.array_equal(y, np.concatenate([crop, crop, crop[: 2 * SR - 2 * crop.shape[0]]]))
    assert np.array_equal(degrade(x, SR, "rep2", rng_for("u", "rep2", 1)), x)
    assert [s.kind for s in parse_condition("rep1.5+gsm+trunc1")] == ["trunc", "gsm", "rep"]
    with pytest.raises(ConditionError, match="longer than 0 s"):
        parse_condition("trunc1+rep0")


def test_every_default_condition_repeats_bit_exactly_per_seed(lists):  # noqa: F811
    bank = bank_of(lists)
    x = speechlike(3.5)
    check_conditions(DEFAULT_CONDITIONS, bank)
    for name in DEFAULT_CONDITIONS:
        if any(s.kind in CODECS and codec_problem(s.kind) for s in parse_condition(name)):
            continue
        a = degrade(x, SR, name, rng_for("spk1-utt1", name, 7), bank)
        b = degrade(x, SR, name, rng_for("spk1-utt1", name, 7), bank)
        assert np.array_equal(a, b), name
        assert np.isfinite(a).all(), name
        if name != "clean":
            assert not np.array_equal(a[: x.shape[0]], x[: a.shape[0]]), name
    # Draws differ by seed and utterance: another noise crop, another crop start.
    a = degrade(x, SR, "noise5", rng_for("u", "noise5", 7), bank)
    assert not np.array_equal(a, degrade(x, SR, "noise5", rng_for("u", "noise5", 8), bank))
    assert not np.array_equal(a, degrade(x, SR, "noise5", rng_for("v", "noise5", 7), bank))


@pytest.mark.parametrize("snr", [-5.0, 0.0, 5.0])
def test_noise_is_added_at_the_stated_snr(lists, snr):  # noqa: F811
    bank = bank_of(lists)
    x = speechlike(2.0).astype(np.float64)
    name = f"noise{snr:g}"
    y = degrade(x, SR, name, rng_for("u", name, 0), bank)
    measured = 10 * np.log10(power(x) / power(y - x))
    assert abs(measured - snr) < 0.01


def test_reverb_keeps_level_and_spreads_energy_in_time(lists):  # noqa: F811
    bank = bank_of(lists)
    x = np.zeros(SR, np.float32)
    x[::4000] = 1.0  # clicks: reverberation gives each a tail
    y = degrade(x, SR, "reverb", rng_for("u", "reverb", 0), bank)
    assert abs(power(y) / power(x) - 1) < 1e-3
    assert np.count_nonzero(np.abs(y) > 1e-3) > 100 * np.count_nonzero(x)


def test_bad_condition_names_the_step_and_missing_audio_is_refused():
    with pytest.raises(ConditionError, match="'tele'"):
        parse_condition("gsm+tele")
    with pytest.raises(ConditionError, match="twice"):
        parse_condition("gsm+ulaw")
    assert [s.kind for s in parse_condition("mp3+noise5+trunc2")] == ["trunc", "noise", "mp3"]
    with pytest.raises(ConditionError, match="needs noise audio"):
        check_conditions(["clean", "noise5"], None)
    # Noise louder than the speech is a condition (`babble-5`); a negative crop is not.
    assert parse_condition("babble-5+gsm")[0] == Step("babble", -5.0)
    with pytest.raises(ConditionError, match="longer than 0 s"):
        parse_condition("trunc-1")


def test_channel_augment_codes_and_shortens_crops_repeatably():
    from speakerlab.dataio.waveform.degrade import ChannelAugment

    crop = np.round(speechlike(2.0) * 32767).astype(np.int16)
    gsm = ChannelAugment(1.0, {"gsm": 1.0}, 0.0, [0.5, 1.5], SR)
    a = gsm.apply(crop.copy(), np.random.default_rng(5))
    assert a.dtype == np.int16 and a.shape == crop.shape
    assert np.array_equal(a, gsm.apply(crop.copy(), np.random.default_rng(5)))
    assert band_energy(a.astype(np.float64), 4100, 8000) < 1e-3 * band_energy(crop.astype(np.float64), 4100, 8000)
    short = ChannelAugment(0.0, {"tel": 1.0}, 1.0, [0.5, 0.5], SR)
    b = short.apply(crop.copy(), np.random.default_rng(0))
    assert np.array_equal(b, np.resize(crop[: SR // 2], crop.shape[0]))  # the first 0.5 s, repeated
    # Never: the crop unchanged; the mix's weights choose the channel (tel only: no codec error beyond it).
    assert np.array_equal(
        ChannelAugment(0.0, {"gsm": 1.0}, 0.0, [0.5, 1], SR).apply(crop, np.random.default_rng(1)), crop
    )


BASE = "model:\n  name: campplus\ndata:\n  train: data/train\n"


@pytest.mark.parametrize(
    "text,match",
    [
        ("augment:\n  channel_prob: 1.5\n", "config key 'augment.channel_prob' must be in \\[0, 1\\]"),
        ("augment:\n  channel_mix: {gsm: 1, fax: 1}\n", "config key 'augment.channel_mix' must map kinds"),
        ("augment:\n  channel_mix: {gsm: 0}\n", "config key 'augment.channel_mix' weights must be"),
        ("augment:\n  short_seconds: [1.0, 0.5]\n", "config key 'augment.short_seconds' must be \\[lo, hi\\]"),
        ("augment:\n  short_prob: -1\n", "config key 'augment.short_prob' must be in \\[0, 1\\]"),
        ("  feats: true\naugment:\n  channel_prob: 0.5\n", "config key 'data.feats': stored features cannot"),
    ],
)
def test_bad_channel_config_names_the_key(tmp_path, text, match):
    from speakerlab.config import ConfigError, load_config

    p = tmp_path / "c.yaml"
    p.write_text(BASE + text)
    with pytest.raises(ConfigError, match=match):
        load_config(p)


def test_channel_config_defaults_and_audio_path(tmp_path):
    from speakerlab.augment_settings import CHANNEL_KINDS
    from speakerlab.config import load_config

    p = tmp_path / "c.yaml"
    p.write_text(BASE)
    a = load_config(p).augment
    assert (a.channel_prob, a.short_prob, a.short_seconds) == (0.0, 0.0, [0.5, 1.5])
    assert a.channel_mix == {k: 1.0 for k in CHANNEL_KINDS}
    cfg = load_config(p, ["augment.channel_prob=0.3"])
    assert cfg.augment.channel_prob == 0.3 and cfg.data.feats is False  # channel augmentation reads audio
