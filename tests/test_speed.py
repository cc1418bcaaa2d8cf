"""Speed perturbation: polyphase resampling against scipy, duration and F0, speaker classes."""

import numpy as np
import pytest
import torch
from scipy.signal import resample_poly

from speakerlab.dataio.waveform.speed import (
    Resampler,
    SpeedPerturb,
    factor_classes,
    input_length,
    resample_ratio,
    speed_labels,
    speed_speaker_names,
)

SR = 16000


@pytest.mark.parametrize("factor", [0.9, 1.1, 0.95, 1.05])
def test_resampler_matches_scipy_resample_poly(factor):
    up, down = resample_ratio(factor)
    x = np.random.default_rng(0).uniform(-1, 1, (3, 4001))
    ours = Resampler(up, down)(torch.from_numpy(x)).double().numpy()
    ref = resample_poly(x, up, down, axis=1)
    assert ours.shape == ref.shape
    # float32 arithmetic against scipy's float64: stated tolerance 1e-5 of full scale.
    np.testing.assert_allclose(ours, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("factor", [0.9, 1.1])
def test_speed_changes_duration_and_f0_by_the_factor(factor):
    n, f0 = 2 * SR, 200.0
    tone = torch.sin(2 * np.pi * f0 * torch.arange(n, dtype=torch.float64) / SR).unsqueeze(0)
    out = Resampler(*resample_ratio(factor))(tone)[0].double().numpy()
    assert out.shape[0] == pytest.approx(n / factor, abs=1)
    spectrum = np.abs(np.fft.rfft(out * np.hanning(out.shape[0]), 8 * out.shape[0]))
    peak_hz = np.argmax(spectrum) * SR / (8 * out.shape[0])
    assert peak_hz == pytest.approx(f0 * factor, abs=1.0)


def test_speed_perturb_gives_the_crop_for_every_factor():
    crop = 4000
    need = {f: input_length(crop, f) for f in (1.0, 0.9, 1.1)}
    assert need[0.9] == 3600 and need[1.1] == 4400 and need[1.0] == crop
    waves = torch.randn(6, max(need.values()))
    classes = torch.tensor([0, 1, 2, 2, 1, 0])
    sp = SpeedPerturb([0.9, 1.0, 1.1])
    out = sp(waves, classes, crop)
    assert out.shape == (6, crop)
    assert torch.equal(out[0], waves[0, :crop])
    for row in (1, 2):
        f = sp.factors[classes[row]]
        ref = resample_poly(waves[row, : need[f]].double().numpy(), *resample_ratio(f))[:crop]
        np.testing.assert_allclose(out[row].double().numpy(), ref, atol=1e-4)


def test_factor_classes_and_bad_factors():
    assert factor_classes([0.9, 1.0, 1.1]) == [1.0, 0.9, 1.1]
    assert factor_classes([1.1, 0.9, 1.1]) == [1.0, 1.1, 0.9]
    assert resample_ratio(0.9) == (10, 9) and resample_ratio(1.1) == (10, 11)
    with pytest.raises(ValueError, match="must be > 0"):
        resample_ratio(0.0)
    with pytest.raises(ValueError, match="not a ratio of integers"):
        resample_ratio(0.912345678)


def test_perturbed_speakers_are_new_classes():
    speakers = ["id1", "id2", "id3"]
    names = speed_speaker_names(speakers, [0.9, 1.0, 1.1])
    assert names == ["id1", "id2", "id3", "sp0.9-id1", "sp0.9-id2", "sp0.9-id3", "sp1.1-id1", "sp1.1-id2", "sp1.1-id3"]
    labels, classes = torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1, 2, 2])
    expanded = speed_labels(labels, classes, len(speakers))
    assert [names[i] for i in expanded] == ["id1", "sp0.9-id3", "sp1.1-id2", "sp1.1-id3"]


def test_resampling_runs_with_tf32_off_and_restores_the_flags():
    """The polyphase convolution sees TF32 off while the run has it on (hardware.tf32), also on error."""
    from tests.helpers import FlagsSeen

    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        with FlagsSeen() as mode:
            Resampler(*resample_ratio(1.1))(torch.randn(2, 1600))
        assert mode.seen == [("conv1d", False, False)]
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        with pytest.raises(ValueError):
            Resampler(10, 9)(torch.randn(1600))
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
