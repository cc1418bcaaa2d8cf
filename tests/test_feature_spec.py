"""The front-end kind of the feature spec (speakerlab.features.spec): its round trip through checkpoints,
old files, the config rules, ReDimNet2 releases through the inference commands, and training on the
ReDimNet2 front-end with a shipped redimnet2 config."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from speakerlab.checkpoint import Checkpoint, CheckpointError, load_checkpoint, save_checkpoint
from speakerlab.config import ConfigError, load_config
from speakerlab.dataio.tables.embeddings import read_embeddings
from speakerlab.features.fbank import Fbank, mean_normalize
from speakerlab.features.redimnet import ReDimNetMel, release_mel_config
from speakerlab.features.spec import KaldiFeatures, build_features
from speakerlab.frontends import (
    FRONT_ENDS,
    FbankConfig,
    FeatureSettings,
    FeatureSpec,
    ReDimNetMelConfig,
    W2VBertFbankConfig,
    WaveformConfig,
    feature_spec,
    section_keys,
)
from speakerlab.inference.cli import embed_parser, run_embed, run_verify
from speakerlab.inference.embedder import embedder_from_args, load_embedder
from speakerlab.inference.extract import main as extract_main
from speakerlab.models import build_model
from tests.fixture_models import assert_embedding_matches, calibrate, filled_state, fixture_input, release_model
from tests.fixture_models import load_redimnet2_fixture as load_fixture
from tests.helpers import make_data_dir, write_wav

ROOT = Path(__file__).resolve().parent.parent
TINY = {"embedding_size": 16, "growth_rate": 8, "bn_size": 2, "init_channels": 16, "m_channels": 8}
SPECS = [
    FeatureSpec(FbankConfig(sample_rate=8000, num_mel_bins=40, window_type="hamming"), mean_norm=False),
    FeatureSpec(ReDimNetMelConfig(n_mels=64, hop_length=200, normalize_signal=False), mean_norm=True),
]


def checkpoint_with(spec: FeatureSpec) -> Checkpoint:
    model = build_model("campplus", feat_dim=spec.feat_dim, num_layers=[1, 1, 1], **TINY)
    args = dict(TINY, feat_dim=spec.feat_dim, num_layers=[1, 1, 1])
    return Checkpoint(model_name="campplus", model_args=args, model=model.state_dict(), features=spec)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kind)
def test_spec_round_trips_through_a_checkpoint(spec, tmp_path):
    save_checkpoint(tmp_path / "c.pt", checkpoint_with(spec))
    raw = torch.load(tmp_path / "c.pt", weights_only=True)
    assert raw["features"]["kind"] == spec.kind
    back = load_checkpoint(tmp_path / "c.pt").features
    assert back == spec and back.kind == spec.kind and back.feat_dim == spec.feat_dim
    assert FeatureSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec  # plain values only


def test_spec_without_kind_reads_as_kaldi_fbank(tmp_path):
    """Schema-2 files written before kinds existed store {fbank, mean_norm}; they read as kaldi_fbank and
    still embed through their fbank (tests/data/legacy_checkpoint covers the schema-1 files)."""
    ck = checkpoint_with(FeatureSpec(FbankConfig(num_mel_bins=80), mean_norm=True))
    raw = ck.to_dict()
    raw["features"] = {"fbank": dataclasses.asdict(FbankConfig(num_mel_bins=80)), "mean_norm": True}
    torch.save(raw, tmp_path / "old.pt")  # no digest: as the first schema-2 files
    spec = load_checkpoint(tmp_path / "old.pt").features
    assert spec.kind == "kaldi_fbank" and spec.fbank == FbankConfig(num_mel_bins=80) and spec.mean_norm
    embedder = load_embedder(tmp_path / "old.pt", device="cpu")
    wave = torch.from_numpy(np.random.default_rng(0).standard_normal(8000).astype(np.float32) * 0.1)
    expected = embedder.model(mean_normalize(Fbank(FbankConfig(num_mel_bins=80))(wave[None])))
    torch.testing.assert_close(embedder(wave[None]), expected, rtol=0, atol=0)


def test_unknown_kind_and_setting_are_named(tmp_path):
    raw = checkpoint_with(SPECS[1]).to_dict()
    raw["features"]["kind"] = "whisper_mel"
    torch.save(raw, tmp_path / "k.pt")
    with pytest.raises(CheckpointError, match="unknown front-end kind 'whisper_mel'"):
        load_checkpoint(tmp_path / "k.pt")
    raw["features"].update(kind="redimnet_mel", redimnet_mel={"n_mels": 72, "nfft": 512})
    torch.save(raw, tmp_path / "s.pt")
    with pytest.raises(CheckpointError, match=r"unknown redimnet_mel setting\(s\) \['nfft'\]"):
        load_checkpoint(tmp_path / "s.pt")


def test_one_builder_per_kind_matches_the_front_end_modules():
    wave = torch.randn(2, 6400, generator=torch.Generator().manual_seed(1)) * 0.1
    kaldi, mel = (build_features(s) for s in SPECS)
    assert isinstance(kaldi, KaldiFeatures) and isinstance(mel, ReDimNetMel)
    fb = FbankConfig(sample_rate=8000, num_mel_bins=40, window_type="hamming")
    torch.testing.assert_close(kaldi(wave), Fbank(fb)(wave), rtol=0, atol=0)
    reference = ReDimNetMel(n_mels=64, hop_length=200, normalize_signal=False)
    torch.testing.assert_close(mel(wave), reference(wave), rtol=0, atol=0)
    # Batch lengths: fbank frames; samples for the whole-wave normalisation of redimnet_mel.
    assert kaldi.batch_length(6400) == kaldi.num_frames(6400) == 78 and mel.num_frames(6400) == 32
    assert mel.batch_length(6400) == 6400


def test_config_kind_and_its_rules(tmp_path):
    base = tmp_path / "c.yaml"
    base.write_text("model: {name: redimnet2_b0}\ndata: {train: x}\nfeatures: {kind: redimnet_mel, num_mel_bins: 72}\n")
    cfg = load_config(base)
    spec = feature_spec(cfg.features, cfg.data.sample_rate)
    assert spec == FeatureSpec(ReDimNetMelConfig(), mean_norm=True)  # 25 / 10 ms at 16 kHz: the releases' front-end
    assert feature_spec(load_config(base, ["features.kind=kaldi_fbank"]).features, 16000).fbank.window_type == "povey"
    for override, key in (
        ("features.window_type=povey", "features.window_type"),
        ("features.dither=1.0", "features.dither"),
        ("data.sample_rate=8000", "features.high_freq"),
        ("data.feats=true", "data.feats"),
        ("features.kind=mfcc", "features.kind"),
    ):
        with pytest.raises(ConfigError, match=f"'{key}'"):
            load_config(base, [override])
    assert load_config(base, ["features.window_type=hamming"]).features.window_type == "hamming"
    with pytest.raises(ConfigError, match="'features.fft_size': kaldi_fbank has no fft_size"):
        load_config(base, ["features.kind=kaldi_fbank", "features.fft_size=512"])


def test_data_feats_auto_is_the_store_where_it_can_serve(tmp_path):
    """data.feats auto: the feature store for Kaldi fbank without augmentation; the audio for a front end the
    store does not hold, with augmentation, or with shards; anything but auto / true / false names the key."""
    base = tmp_path / "c.yaml"
    base.write_text("model: {name: campplus}\ndata: {train: x, feats: auto}\n")
    assert load_config(base).data.feats is True
    assert load_config(base, ["augment.speed_prob=0.5"]).data.feats is False
    assert load_config(base, ["data.shards=s"]).data.feats is False
    mel = ["model.name=redimnet2_b0", "features.kind=redimnet_mel", "features.num_mel_bins=72"]
    assert load_config(base, mel).data.feats is False
    with pytest.raises(ConfigError, match="'data.feats' must be auto, true or false"):
        load_config(base, ["data.feats=maybe"])


# One spec of every kind, none at its defaults where the kind has settings of its own.
EVERY_KIND = [
    FeatureSpec(
        FbankConfig(sample_rate=8000, num_mel_bins=40, window_type="hamming", low_freq=40, high_freq=-200), False
    ),
    FeatureSpec(
        ReDimNetMelConfig(
            n_mels=64,
            n_fft=1024,
            win_length=480,
            hop_length=120,
            f_min=50,
            f_max=7000,
            preemphasis=0.9,
            normalize_signal=False,
        ),
        mean_norm=False,
    ),
    FeatureSpec(WaveformConfig(sample_rate=16000), mean_norm=False),
    FeatureSpec(W2VBertFbankConfig(num_mel_bins=64), mean_norm=True),
]


@pytest.mark.parametrize("spec", EVERY_KIND, ids=lambda s: s.kind)
def test_every_kind_round_trips_through_a_features_section(spec):
    """The registry's mapping both ways: the keys a spec gives, as a config section, give the spec back, with
    the kind's module and width."""
    assert set(FRONT_ENDS) == {s.kind for s in EVERY_KIND}
    keys = section_keys(spec)
    section = FeatureSettings(**keys)
    assert feature_spec(section, spec.sample_rate) == spec
    module = build_features(spec)
    wave = 0.1 * torch.randn(1, 8000, generator=torch.Generator().manual_seed(0))
    out = module(wave)
    assert out.shape[-1] == spec.feat_dim or (spec.feat_dim == 1 and out.shape == wave.shape)
    assert out.shape[1] == module.num_frames(8000) or spec.kind == "waveform"


def test_a_spec_no_section_expresses_is_named():
    with pytest.raises(ValueError, match=r"FbankConfig.snip_edges = False: no key of the features section"):
        section_keys(FeatureSpec(FbankConfig(snip_edges=False)))
    with pytest.raises(ValueError, match=r"W2VBertFbankConfig.stride = 3"):
        section_keys(FeatureSpec(W2VBertFbankConfig(stride=3)))


def test_release_front_end_settings():
    config = load_fixture("b0")["reference_kwargs"]
    assert release_mel_config(config) == ReDimNetMelConfig()
    assert release_mel_config(dict(config, spec_params={}, hop_length=128)) == ReDimNetMelConfig(
        hop_length=128, normalize_signal=False
    )
    with pytest.raises(ValueError, match="feat_type='pt'"):
        release_mel_config(dict(config, feat_type="pt"))
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \['window'\]"):
        release_mel_config(dict(config, spec_params={"window": "hann"}))


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """A b0 release file `{model_config, state_dict}`: the fixture's filled state dict after the fixture's
    BatchNorm calibration, with the front-end's `spec.*` buffers as a release holds them."""
    fixture = load_fixture("b0")
    model = release_model(fixture["reference_kwargs"], filled_state("b0"))
    calibrate(model, fixture_input(fixture))
    state = dict(model.state_dict())
    for name, shape in fixture["frontend_state_dict"]:
        state[name] = torch.zeros(shape)
    path = tmp_path_factory.mktemp("release") / "b0-vox2-lm.pt"
    torch.save({"model_config": fixture["reference_kwargs"], "state_dict": state}, path)
    return path


def cli_embedder(path, *extra):
    ap = embed_parser()
    return embedder_from_args(ap, ap.parse_args(["in.scp", "out.npz", "--redimnet2", str(path), *extra]))


@pytest.mark.slow
def test_release_through_the_cli_gives_the_fixture_embedding(release):
    """The command-line source loads the release with its own front-end; for the fixture's log-mel input
    the model gives the fixture's embedding within the float32 reproducibility bound of
    tests/test_redimnet2.py (a release file holds float32 statistics, so the float64 comparison with the
    official code stays there, on the same loader)."""
    embedder = cli_embedder(release, "--device", "cpu")
    assert embedder.spec == FeatureSpec(ReDimNetMelConfig(), mean_norm=True) and not embedder.model.training
    fixture = load_fixture("b0")
    with torch.no_grad():
        ours = embedder.model(fixture_input(fixture))
    assert_embedding_matches(ours, torch.tensor(fixture["embedding"]))


@pytest.mark.slow
def test_release_embeds_waves_through_embed_verify_and_extract(release, tmp_path, capsys):
    """speakerlab-embed, speakerlab-verify and extraction of a release: ReDimNetMel, then the model, as a
    direct call on each file gives; files of equal length share a batch, others do not."""
    rng = np.random.default_rng(7)
    lengths = {"a": 6400, "b": 6400, "c": 8000, "d": 6450}  # d: a's frame count, not its sample count
    data = make_data_dir(tmp_path / "d", {u: "s" for u in lengths}, seconds=0.1)
    for utt, n in lengths.items():
        write_wav(data / "wav" / f"{utt}.wav", 0.1 * rng.standard_normal(n))
    model = load_embedder(redimnet2=release, device="cpu").model
    direct = {}
    for utt in lengths:
        wave, _ = sf.read(data / "wav" / f"{utt}.wav", dtype="float32")
        with torch.no_grad():
            direct[utt] = model(ReDimNetMel()(torch.from_numpy(wave)[None]))[0].numpy()
    source = ["--redimnet2", str(release), "--device", "cpu"]
    assert run_embed([str(data / "wav.scp"), str(tmp_path / "e.npz"), *source]) == 0
    assert extract_main(["--data", str(data), "--out", str(tmp_path / "x.npz"), "--num-workers", "0", *source]) == 0
    for out in ("e.npz", "x.npz"):
        ids, emb = read_embeddings(tmp_path / out)
        assert ids == list(lengths)
        for i, utt in enumerate(ids):
            np.testing.assert_allclose(emb[i], direct[utt], rtol=1e-4, atol=1e-4 * np.abs(direct[utt]).max())
    capsys.readouterr()
    assert run_verify([str(data / "wav" / "a.wav"), str(data / "wav" / "c.wav"), *source]) == 0
    score = float(capsys.readouterr().out.split()[1])
    a, c = direct["a"], direct["c"]
    assert score == pytest.approx(float(a @ c / np.linalg.norm(a) / np.linalg.norm(c)), abs=1e-5)


def test_not_a_release_is_named(tmp_path, capsys):
    torch.save({"state_dict": {}}, tmp_path / "w.pt")
    scp = tmp_path / "wav.scp"
    scp.write_text(f"a {write_wav(tmp_path / 'a.wav', np.zeros(16000))}\n")
    assert run_embed([str(scp), str(tmp_path / "e.npz"), "--redimnet2", str(tmp_path / "w.pt")]) == 2
    assert f"{tmp_path / 'w.pt'}: not a ReDimNet2 release" in capsys.readouterr().err


@pytest.mark.slow
def test_shipped_redimnet2_config_trains_on_its_front_end(tmp_path):
    """conf/voxceleb/redimnet2_b0.yaml (front-end redimnet_mel), sized down by overrides: a few steps train,
    validation runs through the same front-end, and the checkpoint embeds as ReDimNetMel + its model."""
    from speakerlab.checkpoint import rebuild_model
    from speakerlab.train.loop import main as train_main
    from tests.helpers import losses, tiny_config

    _, train = tiny_config(tmp_path, val=False)
    trials = "".join(f"s{a}-0 s{b}-1 {'target' if a == b else 'nontarget'}\n" for a in range(4) for b in range(4))
    val = make_data_dir(tmp_path / "val", {f"s{s}-{u}": f"s{s}" for s in range(4) for u in range(2)}, 0.7, 1, trials)
    overrides = [
        f"data.train={train}",
        f"data.val={val}",
        "data.crop_seconds=0.5",
        "augment.lists=null",
        "augment.speed_prob=0",
        "loss.margin_start_epoch=0",
        "optim.lr=0.05",
        "optim.warmup_epochs=0",
        "train.epochs=1",
        "train.global_batch_size=8",
        "train.log_every_steps=1",
        "hardware.device=cpu",
        "hardware.precision=fp32",
        "hardware.per_device_batch=4",
        "hardware.num_workers=0",
        "hardware.pin_memory=false",
    ]
    config = str(ROOT / "conf" / "voxceleb" / "redimnet2_b0.yaml")
    assert train_main(["--config", config, "--exp-dir", str(tmp_path / "e"), *overrides]) == 0
    assert sorted(losses(tmp_path / "e")) == [1, 2] and all(np.isfinite(list(losses(tmp_path / "e").values())))
    assert "validation EER" in (tmp_path / "e" / "train.log").read_text()
    ck = load_checkpoint(tmp_path / "e" / "checkpoints" / "epoch_001.pt")
    assert ck.features == FeatureSpec(ReDimNetMelConfig(), mean_norm=True)
    wave = torch.from_numpy(0.1 * np.random.default_rng(3).standard_normal((1, 12000)).astype(np.float32))
    with torch.no_grad():
        expected = rebuild_model(ck)(ReDimNetMel()(wave))
    torch.testing.assert_close(load_embedder(tmp_path / "e", device="cpu")(wave), expected, rtol=1e-5, atol=1e-6)


def test_feature_store_stage_skips_other_kinds(tmp_path, capsys):
    from speakerlab.features.store import main as store_main

    data = make_data_dir(tmp_path / "d", {"a": "s"}, seconds=0.3)
    config = str(ROOT / "conf" / "voxceleb" / "redimnet2_b0.yaml")
    assert store_main(["--config", config, "--data", str(data)]) == 0
    assert "nothing to store for features.kind redimnet_mel" in capsys.readouterr().err
    assert not (data / "feats.scp").exists()


def test_a_model_whose_bins_are_not_the_front_ends_is_one_error_naming_the_key():
    """ReDimNet2 takes 72 mel bins: on the default 80-bin fbank its first forward failed with a shape error inside a
    stage; now the config's key. With its front end, or told the fbank's width, it builds."""
    import contextlib

    from speakerlab.train.build import build_net

    base = {"model": {"name": "redimnet2_b0"}, "data": {"train": "x"}}
    with pytest.raises(
        ConfigError, match=r"'features.num_mel_bins': the front end gives 80 bins and the model takes 72 \(model.args"
    ):
        build_net(load_config(raw=base), 3, contextlib.nullcontext)
    for overrides in (["features.kind=redimnet_mel", "features.num_mel_bins=72"], ["model.args={feat_dim: 80}"]):
        net = build_net(load_config(raw=base, overrides=overrides), 3, contextlib.nullcontext)
        assert net.classifier.weight.shape == (3, 192), overrides
