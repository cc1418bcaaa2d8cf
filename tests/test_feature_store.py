"""Offline feature store: contents, option checks, extraction and training from it."""

import kaldiio
import numpy as np
import pytest
import torch

from speakerlab.config import ConfigError, load_config
from speakerlab.dataio.audio import read_audio
from speakerlab.dataio.lists import ListError
from speakerlab.features.fbank import Fbank, FbankConfig, num_frames
from speakerlab.features.spec import FeatureSpec
from speakerlab.features.store import FEATS_SCP, FeatureCropDataset, FeatureStore, collate_feats, main
from speakerlab.inference.embedder import Embedder
from speakerlab.inference.extract import embed_data_dir
from speakerlab.models import build_model
from speakerlab.train.loop import main as train_main
from tests.helpers import losses, make_data_dir, tiny_config


@pytest.fixture
def data(tmp_path):
    root = make_data_dir(tmp_path / "d", {"a-0": "a", "a-1": "a", "b-0": "b"}, seconds=0.5)
    return root


def test_store_holds_the_fbank_of_every_utterance(data):
    assert main(["--data", str(data)]) == 0
    store = FeatureStore(data, FbankConfig())
    fbank = Fbank()
    for utt in ("a-0", "a-1", "b-0"):
        wave = read_audio(str(data / "wav" / f"{utt}.wav"))
        expected = fbank(torch.from_numpy(wave).unsqueeze(0))[0].numpy()
        np.testing.assert_array_equal(store[utt], expected)
    # Plain Kaldi format: any Kaldi reader gets the same matrices.
    assert sorted(kaldiio.load_scp(str(data / FEATS_SCP))) == ["a-0", "a-1", "b-0"]
    with pytest.raises(ListError, match="'nope' is not in the feature store"):
        store["nope"]


def test_store_with_other_options_names_the_option(data, tmp_path):
    with pytest.raises(ListError, match="no complete feature store; run speakerlab-feature-store"):
        FeatureStore(data)
    assert main(["--data", str(data)]) == 0
    with pytest.raises(ValueError, match="num_mel_bins=80, the config asks for num_mel_bins=64"):
        FeatureStore(data, FbankConfig(num_mel_bins=64))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"model: {{name: campplus}}\ndata: {{train: {data}}}\nfeatures: {{num_mel_bins: 64}}\n")
    assert main(["--data", str(data), "--config", str(cfg)]) == 0
    assert FeatureStore(data, FbankConfig(num_mel_bins=64))["a-0"].shape[1] == 64


def test_frame_crops_follow_the_seed_and_repeat_short_utterances(data):
    main(["--data", str(data)])
    store = FeatureStore(data)
    crop = 16000  # 1 s: longer than the 0.5 s utterances, so they are repeated
    ds = FeatureCropDataset(store, ["a-0", "b-0"], ["x", "y"], [0, 1], crop, FbankConfig())
    a, b = ds[(1, 5)], ds[(1, 5)]
    assert a["feats"].shape == (num_frames(crop, FbankConfig()), 80) and a["label"] == 1 and a["finite"]
    assert np.array_equal(a["feats"], b["feats"])
    full = store["b-0"]
    start = int(np.random.default_rng(5).integers(0, full.shape[0]))
    assert np.array_equal(a["feats"], np.tile(full, (3, 1))[start : start + a["feats"].shape[0]])
    batch = collate_feats([a, ds[(0, 6)]])
    assert batch["feats"].shape == (2, 98, 80) and batch["label"].tolist() == [1, 0]


def test_extraction_from_the_store_equals_extraction_from_audio(data):
    main(["--data", str(data)])
    model = build_model(
        "campplus", embedding_size=32, growth_rate=8, bn_size=2, init_channels=16, m_channels=8, num_layers=[1, 1, 1]
    ).eval()
    embedder = Embedder(model, FeatureSpec(FbankConfig()), "cpu")
    ids, from_audio = embed_data_dir(embedder, data)
    store_ids, from_store = embed_data_dir(embedder, data, store=FeatureStore(data, FbankConfig()))
    assert store_ids == ids and len(FeatureStore(data).entries) == len(ids)
    np.testing.assert_allclose(from_store, from_audio, rtol=1e-5, atol=1e-6)


def test_training_from_the_store(tmp_path):
    cfg, train = tiny_config(tmp_path, val=False)
    assert main(["--data", str(train)]) == 0
    assert (
        train_main(["--config", str(cfg), "--exp-dir", str(tmp_path / "f"), "train.epochs=1", "data.feats=true"]) == 0
    )
    assert sorted(losses(tmp_path / "f")) == [1, 2] and all(np.isfinite(v) for v in losses(tmp_path / "f").values())
    with pytest.raises(ConfigError, match="config key 'data.feats': stored features cannot be augmented"):
        load_config(cfg, ["data.feats=true", "augment.speed_prob=0.5"])


def test_rerun_keeps_an_up_to_date_store_and_rebuilds_a_stale_one(data, tmp_path, capsys):
    other = make_data_dir(tmp_path / "o", {"c-0": "c"}, seconds=0.4, seed=3)
    assert main(["--data", str(data), "--data", str(other)]) == 0  # one process, several data dirs
    ark = data / "feats.ark"
    first = ark.stat().st_mtime_ns
    assert main(["--data", str(data)]) == 0
    assert "up to date (3 utterances)" in capsys.readouterr().out and ark.stat().st_mtime_ns == first
    (data / "wav.scp").write_text((data / "wav.scp").read_text())  # the list changed after the store
    assert main(["--data", str(data)]) == 0
    assert ark.stat().st_mtime_ns != first and FeatureStore(data)["a-1"].shape[1] == 80


def test_validation_reads_the_store_of_the_val_dir(tmp_path, monkeypatch):
    from speakerlab.train import validation

    cfg, _ = tiny_config(tmp_path, val=True)
    val = tmp_path / "val"
    model = build_model("campplus", embedding_size=16, growth_rate=8, init_channels=16, m_channels=4)
    spec = FeatureSpec(FbankConfig(), mean_norm=True)
    from_audio = validation.validation_eer(model, spec, str(val), torch.device("cpu"))
    assert main(["--data", str(val)]) == 0
    from speakerlab.inference import units

    monkeypatch.setattr(units, "AudioUnits", None)  # no audio may be read when the store fits
    assert validation.validation_eer(model, spec, str(val), torch.device("cpu")) == pytest.approx(from_audio)


def test_a_store_of_lists_since_rewritten_says_to_rerun_stage_2(tmp_path, capsys):
    """The data preparation stage re-run on a changed folder (stage 1) rewrites the lists; a store of the old
    ones (stage 2 not re-run) stops training at start with the stage and the command that rebuild it, not a
    count of utterances missing from the store."""
    cfg, train = tiny_config(tmp_path, val=False)
    assert main(["--data", str(train)]) == 0
    make_data_dir(train, {f"s{s}-{u}": f"s{s}" for s in range(5) for u in range(4)}, seconds=0.6, seed=7)
    exp = tmp_path / "f"
    assert train_main(["--config", str(cfg), "--exp-dir", str(exp), "data.feats=true"]) == 2
    err = capsys.readouterr().err
    assert (
        f"error: {train / FEATS_SCP}: the feature store was computed from another wav.scp (4 utterance(s) of wav.scp "
        "not in it, 0 no longer listed: the data preparation stage ran again since); re-run the features stage "
        f"(recipe stage 2: speakerlab-feature-store --data {train})"
    ) in err
    assert main(["--data", str(train)]) == 0  # what the message says to run
    assert FeatureStore(train).entries.keys() == {f"s{s}-{u}" for s in range(5) for u in range(4)}
