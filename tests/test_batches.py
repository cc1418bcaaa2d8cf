import numpy as np
import pytest
import soundfile as sf
import torch

from speakerlab.dataio.loaders.batches import CropDataset, GlobalBatchSampler, collate
from tests.helpers import write_wav


def step_items(sampler, epoch):
    """{step: set of items} from one rank's sampler."""
    sampler.set_epoch(epoch)
    out = {}
    for i, mb in enumerate(sampler):
        out.setdefault(i // sampler.accumulation, set()).update(mb)
    return out


def test_same_samples_per_step_on_any_hardware():
    ref = step_items(GlobalBatchSampler(100, 16, 16, 1, 0, 1, seed=5), 3)
    for micro, accum, world in [(8, 2, 1), (4, 1, 4), (2, 2, 4), (1, 16, 1)]:
        merged = {}
        for rank in range(world):
            for step, items in step_items(GlobalBatchSampler(100, 16, micro, accum, rank, world, seed=5), 3).items():
                merged.setdefault(step, set()).update(items)
        assert merged == ref, (micro, accum, world)


def test_epochs_differ_and_cover_the_data():
    s = GlobalBatchSampler(100, 10, 10, 1, seed=1)
    e0, e1 = step_items(s, 0), step_items(s, 1)
    assert e0 != e1
    assert sorted(i for items in e0.values() for i, _ in items) == list(range(100))


def test_resume_mid_epoch_continues_identically():
    s = GlobalBatchSampler(90, 12, 6, 2, seed=2)
    s.set_epoch(4)
    full = list(s)
    s.set_epoch(4, start_step=3)
    assert list(s) == full[3 * 2 :]
    assert len(s) == len(full) - 6


def test_plan_mismatch_and_too_little_data():
    with pytest.raises(ValueError, match="global batch 64 != micro batch 16 x accumulation 2 x world size 1"):
        GlobalBatchSampler(100, 64, 16, 2)
    with pytest.raises(ValueError, match="fewer than one global batch"):
        GlobalBatchSampler(10, 16, 16, 1)


def test_dataset_crops_by_seed(tmp_path):
    paths = [
        str(write_wav(tmp_path / f"{i}.wav", np.random.default_rng(i).integers(-999, 999, 8000).astype(np.int16)))
        for i in range(2)
    ]
    ds = CropDataset(paths, [0, 1], [8000, 8000], crop_samples=3000)
    a, b, c = ds[(1, 77)], ds[(1, 77)], ds[(1, 78)]
    assert a["wave"].shape == (3000,) and a["wave"].dtype == np.int16 and a["label"] == 1 and a["index"] == 1
    assert a["finite"] and a["speed"] == 0 and a["picked"] is None
    assert np.array_equal(a["wave"], b["wave"]) and not np.array_equal(a["wave"], c["wave"])
    # int16 files are read as they are: the crop is a slice of the file at the drawn offset.
    whole = sf.read(paths[1], dtype="int16")[0]
    start = int(np.random.default_rng(77).integers(0, 8000 - 3000 + 1))
    assert np.array_equal(a["wave"], whole[start : start + 3000])
    batch = collate([a, c])
    assert batch["wave"].shape == (2, 3000) and batch["wave"].dtype == torch.int16
    assert batch["label"].tolist() == [1, 1] and batch["rir"].shape[0] == batch["noise"].shape[0] == 0
