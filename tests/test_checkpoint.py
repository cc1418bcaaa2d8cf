"""speakerlab.checkpoint: the one schema (round trip, the pre-schema files), and the inference path
built on it (speakerlab.inference.embedder)."""

from pathlib import Path

import numpy as np
import pytest
import torch

from speakerlab.checkpoint import (
    Checkpoint,
    CheckpointError,
    ResumeState,
    checkpoint_files,
    latest_checkpoint,
    load_checkpoint,
    load_given,
    load_latest,
    prune_checkpoints,
    rebuild_model,
    remove_stale_temp_files,
    save_checkpoint,
)
from speakerlab.dataio.tables.embeddings import read_embeddings
from speakerlab.frontends import FbankConfig, FeatureSpec
from speakerlab.inference.embedder import load_embedder
from speakerlab.models import build_model
from speakerlab.train.state.average import average_checkpoints
from tests.helpers import TINY_CAMPPLUS as TINY

LEGACY = Path(__file__).resolve().parent / "data" / "legacy_checkpoint"


def tiny_checkpoint(step=3, epoch=1, seed=0, resume=True, **over) -> Checkpoint:
    torch.manual_seed(seed)
    model = build_model("campplus", **TINY)
    state = (
        ResumeState(
            optimizer={"state": {}, "param_groups": []},
            scaler={},
            step_in_epoch=2,
            skipped_steps=1,
            rng_cpu=torch.get_rng_state(),
        )
        if resume
        else None
    )
    fields = dict(
        model_name="campplus",
        model_args=dict(TINY),
        model=model.state_dict(),
        features=FeatureSpec(FbankConfig(sample_rate=8000, num_mel_bins=80), mean_norm=False),
        speakers=["a", "b"],
        classifier={"weight": torch.randn(2, 16)},
        step=step,
        epoch=epoch,
        resume=state,
        config={"anything": {"renamed_key": 1}},
    )
    fields.update(over)
    return Checkpoint(**fields)


def test_round_trip_keeps_every_field(tmp_path):
    ck = tiny_checkpoint()
    save_checkpoint(tmp_path / "c.pt", ck)
    back = load_checkpoint(tmp_path / "c.pt")
    assert (back.model_name, back.model_args, back.speakers, back.step, back.epoch, back.config) == (
        ck.model_name,
        ck.model_args,
        ck.speakers,
        ck.step,
        ck.epoch,
        ck.config,
    )
    assert back.features == ck.features and back.features.sample_rate == 8000 and not back.features.mean_norm
    assert (back.resume.step_in_epoch, back.resume.skipped_steps) == (2, 1)
    assert torch.equal(back.resume.rng_cpu, ck.resume.rng_cpu)
    for k, v in ck.model.items():
        assert torch.equal(back.model[k], v)
    assert not list(tmp_path.glob(".*tmp*"))  # the temporary file was renamed away


def test_inference_never_reads_the_training_config(tmp_path):
    """The stored config is provenance only: keys that no longer exist do not stop extraction."""
    save_checkpoint(tmp_path / "c.pt", tiny_checkpoint(config={"train": {"a_key_from_the_future": 1}, "x": None}))
    embedder = load_embedder(tmp_path / "c.pt", device="cpu")
    assert embedder.sample_rate == 8000 and not embedder.model.training
    assert embedder.embed_waves([np.zeros(8000, np.float32) + 0.01]).shape == (1, 16)


def test_checkpoint_written_before_the_schema_extracts_as_before():
    """tests/data/legacy_checkpoint: written by the training of e951788, with the embeddings that that
    commit's extraction gave for the four wavs."""
    ck = load_checkpoint(LEGACY / "campplus_tiny.pt")
    assert ck.model_name == "campplus" and ck.features.sample_rate == 16000 and ck.features.mean_norm
    assert ck.resume is not None and ck.step == 2 and len(ck.speakers) == 4
    ids, before = read_embeddings(LEGACY / "embeddings.npz")
    embedder = load_embedder(LEGACY / "campplus_tiny.pt", device="cpu")
    now = embedder.embed_waves([embedder.read(str(LEGACY / "wav" / f"{u}.wav")) for u in ids])
    np.testing.assert_allclose(now, before, rtol=1e-5, atol=1e-6)


def test_not_a_checkpoint_is_named(tmp_path):
    torch.save(build_model("campplus", **TINY).state_dict(), tmp_path / "state.bin")
    with pytest.raises(CheckpointError, match=f"{tmp_path / 'state.bin'}: not a speakerlab checkpoint.*--3dspeaker"):
        load_checkpoint(tmp_path / "state.bin")
    raw = tiny_checkpoint().to_dict()
    raw["schema"] = 99
    torch.save(raw, tmp_path / "new.pt")
    with pytest.raises(CheckpointError, match="schema 99 is newer"):
        load_checkpoint(tmp_path / "new.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a zip")
    with pytest.raises(CheckpointError, match=f"checkpoint {tmp_path / 'junk.pt'} cannot be loaded"):
        load_checkpoint(tmp_path / "junk.pt")
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.pt")


def test_newest_by_name_and_prune(tmp_path):
    d = tmp_path / "exp" / "checkpoints"
    for epoch in (1, 2, 3):
        save_checkpoint(d / f"epoch_{epoch:03d}.pt", tiny_checkpoint(step=10 * epoch, epoch=epoch))
    assert latest_checkpoint(d).name == "epoch_003.pt"
    save_checkpoint(d / "partial_004.pt", tiny_checkpoint(step=35, epoch=3))
    assert latest_checkpoint(d).name == "partial_004.pt"
    save_checkpoint(d / "partial_003.pt", tiny_checkpoint(step=25, epoch=2))  # left by a crash: older
    assert latest_checkpoint(d).name == "partial_004.pt"
    assert load_given(tmp_path / "exp")[0] == d / "partial_004.pt"
    assert load_given(d / "epoch_001.pt")[1].step == 10
    with pytest.raises(CheckpointError, match="no checkpoint under"):
        load_given(tmp_path)
    (tmp_path / "other" / "checkpoints").mkdir(parents=True)
    save_checkpoint(tmp_path / "other" / "checkpoints" / "c.pt", tiny_checkpoint(step=1, epoch=1))
    with pytest.raises(CheckpointError, match=r"partial_N.pt \(for c.pt there, give that file\)"):
        load_given(tmp_path / "other")
    assert load_given(tmp_path / "other" / "checkpoints" / "c.pt")[1].step == 1
    with pytest.raises(ValueError, match="keep must be >= 1"):
        prune_checkpoints(d, 0)
    assert [p.name for p in checkpoint_files(d)] == ["epoch_001.pt", "epoch_002.pt", "epoch_003.pt"]
    prune_checkpoints(d, 1)
    assert [p.name for p in checkpoint_files(d)] == ["epoch_003.pt"]


def corrupt(path: Path) -> None:
    """Flip bytes inside the largest tensor's data, leaving the zip structure readable."""
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid : mid + 64] = bytes(b ^ 0x5A for b in data[mid : mid + 64])
    path.write_bytes(bytes(data))


def test_corrupt_checkpoint_is_named_and_the_previous_one_used(tmp_path):
    for epoch in (1, 2):
        save_checkpoint(tmp_path / f"epoch_{epoch:03d}.pt", tiny_checkpoint(step=10 * epoch, epoch=epoch))
    corrupt(tmp_path / "epoch_002.pt")
    with pytest.raises(CheckpointError, match=f"{tmp_path / 'epoch_002.pt'}( is corrupt| cannot be loaded)"):
        load_checkpoint(tmp_path / "epoch_002.pt")
    warnings = []
    path, ck = load_latest(tmp_path, warn=warnings.append)
    assert path.name == "epoch_001.pt" and ck.step == 10
    assert len(warnings) == 1 and "epoch_002.pt" in warnings[0] and "using the previous checkpoint" in warnings[0]
    corrupt(tmp_path / "epoch_001.pt")
    with pytest.raises(CheckpointError, match="no intact checkpoint") as e:
        load_latest(tmp_path)
    assert "epoch_001.pt" in str(e.value) and "epoch_002.pt" in str(e.value)


def test_old_truncated_checkpoint_is_never_opened(tmp_path):
    save_checkpoint(tmp_path / "epoch_001.pt", tiny_checkpoint(step=10, epoch=1))
    (tmp_path / "epoch_001.pt").write_bytes((tmp_path / "epoch_001.pt").read_bytes()[:1000])  # truncated
    save_checkpoint(tmp_path / "epoch_002.pt", tiny_checkpoint(step=20, epoch=2))
    warnings = []
    assert load_latest(tmp_path, warn=warnings.append)[1].step == 20 and warnings == []


def test_failed_write_leaves_no_temp_file_and_stale_ones_are_removed(tmp_path, monkeypatch):
    save_checkpoint(tmp_path / "epoch_001.pt", tiny_checkpoint(step=10))
    (tmp_path / ".epoch_002.pt.tmp4242").write_bytes(b"half a checkpoint")  # a killed run's
    assert [p.name for p in remove_stale_temp_files(tmp_path)] == [".epoch_002.pt.tmp4242"]

    def full_disk(obj, f):
        f.write(b"x" * 100)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(CheckpointError, match="cannot write checkpoint .*epoch_002.pt.*No space left.*intact"):
        save_checkpoint(tmp_path / "epoch_002.pt", tiny_checkpoint(step=20))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch_001.pt"]


def test_average_and_rebuild(tmp_path):
    paths = []
    for seed in (0, 1):
        paths.append(tmp_path / f"{seed}.pt")
        save_checkpoint(paths[-1], tiny_checkpoint(seed=seed))
    avg = average_checkpoints(paths)
    a, b = load_checkpoint(paths[0]), load_checkpoint(paths[1])
    key = next(k for k, v in a.model.items() if v.is_floating_point() and v.ndim > 1)
    torch.testing.assert_close(avg.model[key], (a.model[key] + b.model[key]) / 2)
    torch.testing.assert_close(avg.classifier["weight"], (a.classifier["weight"] + b.classifier["weight"]) / 2)
    assert avg.resume is None and avg.averaged_from == [str(p) for p in paths]
    save_checkpoint(tmp_path / "renamed.pt", tiny_checkpoint(seed=2, speakers=["a", "c"]))
    assert average_checkpoints([paths[0], tmp_path / "renamed.pt"]).classifier is None  # other classes
    model = rebuild_model(avg)
    assert not model.training and model(torch.randn(1, 50, 80)).shape == (1, 16)
    other = tiny_checkpoint(
        model_name="ecapa_tdnn_c512", model=build_model("ecapa_tdnn_c512").state_dict(), model_args={}
    )
    save_checkpoint(tmp_path / "other.pt", other)
    with pytest.raises(ValueError, match="different models"):
        average_checkpoints([paths[0], tmp_path / "other.pt"])
