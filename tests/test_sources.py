"""The one reader of pretrained models (speakerlab.sources) and what it promises: a source embeds (load_embedder)
and fine-tunes (train.init) with the same model, sizes and front-end; a run reads it once and records its
front-end; a file that is no source is named, without torch's advice to unpickle it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import yaml

from speakerlab.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from speakerlab.config import ConfigError
from speakerlab.frontends import FeatureSpec, ReDimNetMelConfig, feature_spec, section_keys
from speakerlab.inference.cli import run_embed
from speakerlab.inference.embedder import load_embedder
from speakerlab.models import build_model, builder_defaults
from speakerlab.sources import THREEDSPEAKER_FEATURES, SourceError, read_source
from speakerlab.train.build import build_run, load_train_config
from speakerlab.train.loop import main as train_main
from speakerlab.train.state.resume import resume
from tests.fixture_models import fill_state_dict, filled_state, load_fixture, load_redimnet2_fixture
from tests.helpers import TINY_MODEL, make_data_dir, write_wav

RUN = {
    "data": {"crop_seconds": 0.5},
    "optim": {"lr": 0.01, "warmup_epochs": 0},
    "train": {"epochs": 1, "global_batch_size": 8, "log_every_steps": 1},
    "hardware": {"device": "cpu", "precision": "fp32", "per_device_batch": 4, "num_workers": 0, "pin_memory": False},
}


def release_file(tmp_path):
    """A ReDimNet2 B0 release as the published files are: `{"model_config", "state_dict"}`, the state dict filled
    by the fixture rule (tests/fixture_models.py), the front-end's `spec.*` buffers included."""
    fixture = load_redimnet2_fixture("b0")
    state = {**filled_state("b0"), **fill_state_dict(fixture["frontend_state_dict"])}
    path = tmp_path / "b0-vox2-ptn.pt"
    torch.save({"model_config": fixture["reference_kwargs"], "state_dict": state}, path)
    return path


def threedspeaker_file(tmp_path):
    """A 3D-Speaker CAM++ of the zoo (192-D embeddings; the builder's default is 512), filled by the fixture rule
    and nested as the zoo's training scripts save it."""
    state = fill_state_dict(load_fixture("campplus")["state_dict"])
    path = tmp_path / "campplus_zoo.bin"
    torch.save({"state_dict": {f"module.{k}": v for k, v in state.items()}}, path)
    return path


def finetune_config(tmp_path, **train) -> str:
    """A fine-tuning config without model and features sections: train.init brings both."""
    data = make_data_dir(tmp_path / "data", {f"s{s}-{u}": f"s{s}" for s in range(4) for u in range(2)}, seconds=0.6)
    raw = json.loads(json.dumps(RUN))
    raw["data"]["train"] = str(data)
    raw["train"].update(train)
    path = tmp_path / "finetune.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def count_reads(monkeypatch, path) -> list:
    """Every torch.load of `path` from now on (appended to the returned list)."""
    reads, load = [], torch.load

    def counting(f, *args, **kwargs):
        if str(f) == str(path):
            reads.append(f)
        return load(f, *args, **kwargs)

    monkeypatch.setattr(torch, "load", counting)
    return reads


# kind -> (the file's writer, its train.init keys, load_embedder's arguments for it)
SOURCES = {
    "redimnet2": (release_file, {}, lambda path: {"redimnet2": path}),
    "3dspeaker": (
        threedspeaker_file,
        {"init_3dspeaker": "campplus"},
        lambda path: {"threedspeaker": "campplus", "weights": path},
    ),
}


# The 3D-Speaker case builds a full-size CAM++ three times (~30 s on 2 loaded cores): the full suite runs it.
@pytest.mark.parametrize("kind", ["redimnet2", pytest.param("3dspeaker", marks=pytest.mark.slow)])
def test_a_source_embeds_and_fine_tunes_with_the_same_front_end(kind, tmp_path, monkeypatch):
    """The model of a fresh train.init run, at its first step (initialised, before any update, in eval mode,
    through the training front-end without augmentation), embeds a wave as load_embedder's model does; the
    config is completed from the source (front-end and sizes), and the file is read once for the run."""
    write, init, embedder_args = SOURCES[kind]
    path = write(tmp_path)
    reads = count_reads(monkeypatch, path)
    cfg, src = load_train_config([finetune_config(tmp_path, init=str(path), **init)], [], None)
    run = build_run(cfg, tmp_path / "exp", src)
    assert resume(run) == 0 and run.init is None  # initialised from the source, which the run then lets go
    assert len(reads) == 1
    assert feature_spec(cfg.features, cfg.data.sample_rate) == src.features
    assert {k: getattr(cfg.features, k) for k in section_keys(src.features)} == section_keys(src.features)
    wave = torch.from_numpy(0.1 * np.random.default_rng(5).standard_normal((1, 12000)).astype(np.float32))
    model = run.raw.model.eval()
    with torch.no_grad():
        trained = model(run.inputs.features(wave))
    embedder = load_embedder(**embedder_args(path), device="cpu")
    assert embedder.spec == src.features and embedder.model.__class__ is model.__class__
    torch.testing.assert_close(trained, embedder(wave), rtol=1e-5, atol=1e-5 * float(trained.abs().max()))
    if kind == "redimnet2":
        assert src.features == FeatureSpec(ReDimNetMelConfig(), mean_norm=True) and cfg.features.kind == "redimnet_mel"
        assert cfg.model.name == "redimnet2_b0" and embedder.spec.feat_dim == 72
    else:  # both paths read the embedding size from the file
        assert src.features == THREEDSPEAKER_FEATURES and builder_defaults("campplus")["embedding_size"] != 192
        assert cfg.model.args == {"embedding_size": 192} and trained.shape == embedder(wave).shape == (1, 192)


def test_data_feats_auto_follows_the_front_end_a_source_brings(tmp_path):
    """A ReDimNet2 release brings its own log-mel, which the feature store does not hold: data.feats auto reads the
    audio (egs/custom's default), data.feats true is one error naming the key."""
    config = [finetune_config(tmp_path, init=str(release_file(tmp_path)))]
    cfg, _ = load_train_config(config, ["data.feats=auto"], None)
    assert cfg.features.kind == "redimnet_mel" and cfg.data.feats is False
    with pytest.raises(ConfigError, match="config key 'data.feats': the feature store holds Kaldi fbank"):
        load_train_config(config, ["data.feats=true"], None)


@pytest.mark.slow  # a whole run (~11 s)
def test_a_run_from_a_release_reads_it_once_and_records_its_front_end(tmp_path, monkeypatch):
    path = release_file(tmp_path)
    reads = count_reads(monkeypatch, path)
    exp = tmp_path / "exp"
    assert train_main(["--config", finetune_config(tmp_path, init=str(path)), "--exp-dir", str(exp)]) == 0
    assert len(reads) == 1
    src = read_source(path)
    recorded = yaml.safe_load((exp / "config.yaml").read_text())["features"]
    assert {k: recorded[k] for k in section_keys(src.features)} == section_keys(src.features)
    for name in ("pretrained.pt", "checkpoints/epoch_001.pt"):
        assert load_checkpoint(exp / name).features == src.features, name


def test_a_text_file_given_as_weights_is_named_without_torchs_advice(tmp_path, capsys):
    """torch's own error for such a file advises loading it with weights_only=False (which runs any code the file
    holds): neither the inference commands nor train.init pass that on."""
    notes = tmp_path / "campplus.txt"
    notes.write_text("model:\n  name: campplus\nweights: see the model zoo\n")
    with pytest.raises(Exception, match="weights_only"):
        torch.load(notes, weights_only=True)
    scp = tmp_path / "wav.scp"
    scp.write_text(f"a {write_wav(tmp_path / 'a.wav', np.zeros(16000))}\n")
    assert run_embed([str(scp), str(tmp_path / "e.npz"), "--3dspeaker", "campplus", "--weights", str(notes)]) == 2
    config = finetune_config(tmp_path, init=str(notes), init_3dspeaker="campplus")
    assert train_main(["--config", config, "--exp-dir", str(tmp_path / "exp")]) == 2
    embed_err, train_err = capsys.readouterr().err.strip().split("\n")
    for err in (embed_err, train_err):
        assert f"{notes} cannot be loaded: it is a text file, not a PyTorch weights file" in err
        assert "weights_only" not in err
    assert train_err.startswith("error: config key 'train.init': checkpoint")
    with pytest.raises(SourceError, match=str(notes)):
        read_source(notes, threedspeaker="campplus")


def test_an_exp_dir_gives_its_newest_intact_checkpoint_and_names_a_corrupt_newer_one(tmp_path):
    model = build_model("campplus", **yaml.safe_load(TINY_MODEL)["model"]["args"])
    ckpt = Checkpoint(
        model_name="campplus",
        model_args=yaml.safe_load(TINY_MODEL)["model"]["args"],
        model=model.state_dict(),
        features=FeatureSpec(),
        speakers=["a", "b"],
        classifier={"weight": torch.ones(2, 32)},
        config={"loss": {"name": "sphereface2"}},
    )
    save_checkpoint(tmp_path / "exp" / "checkpoints" / "epoch_001.pt", ckpt)
    (tmp_path / "exp" / "checkpoints" / "epoch_002.pt").write_bytes(b"cut short")
    warnings = []
    src = read_source(tmp_path / "exp", warn=warnings.append)
    assert (src.kind, src.path.name, src.speakers, src.loss) == (
        "speakerlab",
        "epoch_001.pt",
        ["a", "b"],
        "sphereface2",
    )
    assert len(warnings) == 1 and "epoch_002.pt" in warnings[0]
    built = src.build()
    assert not built.training and all(torch.equal(built.state_dict()[k], v) for k, v in ckpt.model.items())


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing", "checkpoint {path} does not exist"),
        ("state dict without a name", "{path}: not a speakerlab checkpoint (no model_name/model) nor a ReDimNet2"),
        ("release as 3D-Speaker", "{path} is a ReDimNet2 release, not a 3D-Speaker state dict"),
        ("unknown model name", "unknown model 'campplux'"),
        ("release of no registered size", "{path}: its ReDimNet2 stages (C=13) are none of the sizes b0-b6"),
    ],
)
def test_every_bad_source_is_one_error_naming_it(tmp_path, case, message):
    path = tmp_path / "w.pt"
    name = {"release as 3D-Speaker": "campplus", "unknown model name": "campplux"}.get(case)
    if case == "state dict without a name":
        torch.save(fill_state_dict(load_fixture("campplus")["state_dict"]), path)
    elif case != "missing":
        fixture = load_redimnet2_fixture("b0")
        config = dict(fixture["reference_kwargs"], C=13 if "size" in case else 12)
        torch.save({"model_config": config, "state_dict": {}}, path)
    with pytest.raises(SourceError) as e:
        read_source(path, threedspeaker=name)
    assert message.format(path=path) in str(e.value)
    assert e.value.about == ("name" if name else "file")


def test_a_source_whose_front_end_cannot_feed_its_model_is_one_error_naming_it(tmp_path, capsys):
    """A ReDimNet2 state dict given as a 3D-Speaker one (--3dspeaker redimnet2_b0): its weights fit, but the zoo's
    80-bin fbank cannot feed a 72-bin model. That was a RuntimeError traceback at the first batch; now one line
    naming the file and the mismatch, before any audio is read."""
    path = tmp_path / "redimnet2_b0_state.pt"
    torch.save(filled_state("b0"), path)
    with pytest.raises(SourceError, match=r"redimnet2_b0_state.pt: its front-end \(kaldi_fbank, 80 bins"):
        read_source(path, threedspeaker="redimnet2_b0").build()
    wav = write_wav(tmp_path / "a.wav", 0.1 * np.random.default_rng(0).standard_normal(16000))
    (tmp_path / "wav.scp").write_text(f"a {wav}\n")
    argv = [str(tmp_path / "wav.scp"), str(tmp_path / "e.npz"), "--3dspeaker", "redimnet2_b0", "--weights", str(path)]
    assert run_embed(argv + ["--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {path}: its front-end") and "takes 72" in err[0]
    assert not (tmp_path / "e.npz").exists()
