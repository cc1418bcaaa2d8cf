import numpy as np
import pytest
import soundfile as sf

from speakerlab.dataio.audio import AudioError, audio_info, read_audio, read_crop, read_crop_int16
from tests.helpers import write_wav


def ramp_wav(tmp_path, n=16000, sr=16000):
    x = (np.arange(n) % 30000).astype(np.int16)
    return write_wav(tmp_path / "ramp.wav", x, sr), x.astype(np.float32) / 32768


def test_crop_reads_only_the_crop(tmp_path, monkeypatch):
    path, ref = ramp_wav(tmp_path)
    calls = []
    real_read = sf.read

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real_read(*args, **kwargs)

    monkeypatch.setattr(sf, "read", spy)
    crop = read_crop(str(path), 4000, 16000, np.random.default_rng(3))
    assert crop.shape == (4000,) and crop.dtype == np.float32
    start = calls[0]["start"]
    assert calls[0]["frames"] == 4000  # partial read, not a full decode
    np.testing.assert_array_equal(crop, ref[start : start + 4000])


def test_crop_deterministic_per_seed(tmp_path):
    path, _ = ramp_wav(tmp_path)
    a = read_crop(str(path), 4000, 16000, np.random.default_rng(7))
    b = read_crop(str(path), 4000, 16000, np.random.default_rng(7))
    np.testing.assert_array_equal(a, b)


def test_short_utterance_repeated_to_length(tmp_path):
    path, ref = ramp_wav(tmp_path, n=1000)
    crop = read_crop(str(path), 3500, 1000, np.random.default_rng(0))
    assert crop.shape == (3500,)
    # Every sample continues the utterance cyclically.
    start = int(np.where(ref == crop[0])[0][0])
    np.testing.assert_array_equal(crop, ref[(start + np.arange(3500)) % 1000])


def test_wrong_rate_and_channels_are_errors(tmp_path):
    p8 = write_wav(tmp_path / "8k.wav", np.zeros(800, np.int16), 8000)
    with pytest.raises(AudioError, match=f"{p8}: sample rate 8000 Hz, expected 16000 Hz"):
        audio_info(str(p8))
    with pytest.raises(AudioError, match="8000 Hz"):
        read_audio(str(p8))
    st = write_wav(tmp_path / "st.wav", np.zeros((1600, 2), np.int16))
    with pytest.raises(AudioError, match=f"{st}: 2 channels, expected mono"):
        audio_info(str(st))


def test_unreadable_file_named(tmp_path):
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"not audio")
    with pytest.raises(AudioError, match=str(bad)):
        audio_info(str(bad))


def test_int16_crops_pcm_exact_float_rounded_nonfinite_flagged(tmp_path):
    ints = np.random.default_rng(0).integers(-30000, 30000, 8000).astype(np.int16)
    pcm = write_wav(tmp_path / "pcm.wav", ints)
    crop, finite = read_crop_int16(str(pcm), 3000, 8000, np.random.default_rng(4))
    start = int(np.random.default_rng(4).integers(0, 8000 - 3000 + 1))  # the draw of read_crop
    assert finite and crop.dtype == np.int16 and np.array_equal(crop, ints[start : start + 3000])
    short, _ = read_crop_int16(str(pcm), 20000, 8000, np.random.default_rng(4))
    as_float = read_crop(str(pcm), 20000, 8000, np.random.default_rng(4))
    np.testing.assert_array_equal(short, np.round(as_float * 32768).astype(np.int16))  # same tiling and phase
    x = np.linspace(-0.5, 0.5, 4000, dtype=np.float32)
    flt = write_wav(tmp_path / "f.wav", x, subtype="FLOAT")
    crop, finite = read_crop_int16(str(flt), 4000, 4000, np.random.default_rng(0))
    assert finite and np.abs(crop / 32768.0 - x).max() <= 0.5 / 32768 + 1e-9
    x[100] = np.nan
    write_wav(flt, x, subtype="FLOAT")
    assert read_crop_int16(str(flt), 4000, 4000, np.random.default_rng(0))[1] is False
