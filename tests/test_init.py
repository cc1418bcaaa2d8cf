"""Starting a run from a pretrained model (`train.init`, speakerlab.train.state.init): the model section taken from
the source, the weights loaded, a new classifier (or the rows of matching speakers), the trunk frozen for the
first epochs, a lower LR for it; from our checkpoints, 3D-Speaker state dicts and ReDimNet2 release files."""

import os
import subprocess
import sys
import zlib

import numpy as np
import pytest
import torch
import yaml

from speakerlab.checkpoint import load_checkpoint
from speakerlab.config import ConfigError
from speakerlab.frontends import FeatureSpec, ReDimNetMelConfig
from speakerlab.sources import read_source
from speakerlab.train.build import build_optimizer, build_run, load_train_config
from speakerlab.train.loop import main as train_main
from speakerlab.train.optim.groups import parameter_groups
from speakerlab.train.state.resume import resume
from tests.fixture_models import fill_state_dict, load_fixture, load_redimnet2_fixture
from tests.helpers import ROOT, assert_no_traceback, free_port, losses, new_data, tiny_config, write_config

TRUNK_EPOCH_1 = [{"modules": ["trunk"], "until_epoch": 1}]  # train.freeze: the classifier alone in epoch 1


@pytest.fixture
def pretrained(tiny_model):
    """A tiny CAM++ trained one epoch on speakers s0-s3 (the session's, tests/conftest.py): its exp dir."""
    return tiny_model.exp


def fresh_run(config: str, exp, *overrides):
    cfg, init = load_train_config([config], list(overrides), None)
    run = build_run(cfg, exp, init)
    assert resume(run) == 0
    return run


def test_model_section_is_taken_from_the_checkpoint_and_recorded(pretrained, tmp_path):
    config = write_config(tmp_path, new_data(tmp_path), train={"init": str(pretrained)})
    exp = tmp_path / "ft"
    assert train_main(["--config", config, "--exp-dir", str(exp), "train.epochs=1"]) == 0
    source = load_checkpoint(pretrained / "checkpoints" / "epoch_001.pt")
    saved = yaml.safe_load((exp / "config.yaml").read_text())
    assert saved["model"] == {"name": "campplus", "args": source.model_args}
    log = (exp / "train.log").read_text()
    assert f"initialised from {pretrained / 'checkpoints' / 'epoch_001.pt'} (speakerlab campplus)" in log
    assert "new classifier for 4 speakers" in log
    start = load_checkpoint(exp / "pretrained.pt")  # the initialised model, before any step
    assert start.classifier is None and start.model_args == source.model_args
    for key, value in source.model.items():
        torch.testing.assert_close(start.model[key], value, rtol=0, atol=0)
    assert load_checkpoint(exp / "checkpoints" / "epoch_001.pt").speakers == ["n0", "n1", "s2", "s3"]


def test_matching_speakers_start_from_the_source_rows(pretrained, tmp_path):
    config = write_config(tmp_path, new_data(tmp_path), train={"init": str(pretrained), "init_match_speakers": True})
    run = fresh_run(config, tmp_path / "ft")
    source = load_checkpoint(pretrained / "checkpoints" / "epoch_001.pt")
    w, old = run.raw.classifier.weight.detach(), source.classifier["weight"]
    assert run.speakers == ["n0", "n1", "s2", "s3"] and source.speakers == ["s0", "s1", "s2", "s3"]
    torch.testing.assert_close(w[2:], old[2:], rtol=0, atol=0)  # s2, s3: the source's rows
    assert not torch.equal(w[0], old[0]) and not torch.equal(w[1], old[1])  # n0, n1: new rows
    # Without the option every row is new (the seeded initialisation).
    plain = fresh_run(write_config(tmp_path, new_data(tmp_path), train={"init": str(pretrained)}), tmp_path / "p")
    assert not torch.equal(plain.raw.classifier.weight[2], old[2])


def test_same_speakers_keep_the_classifier(pretrained, tmp_path, capsys):
    """Large-margin fine-tuning (stage 7): the source's speakers and head, so its classifier is kept."""
    cfg, train = tiny_config(tmp_path, val=False)
    run = fresh_run(str(cfg), tmp_path / "lm", f"train.init={pretrained}")
    source = load_checkpoint(pretrained / "checkpoints" / "epoch_001.pt")
    torch.testing.assert_close(run.raw.classifier.weight.detach(), source.classifier["weight"], rtol=0, atol=0)
    assert "classifier kept (4 speakers, as in the source)" in capsys.readouterr().err


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.name=ecapa_tdnn_c512", "config key model.name: 'ecapa_tdnn_c512' in the config, 'campplus' in {src}"),
        ("model.args.embedding_size=64", "config key model.args.embedding_size: 64 in the config, 32 in {src}"),
        ("model.args.num_layers=[2,1,1]", "config key model.args.num_layers: [2, 1, 1] in the config, [1, 1, 1] in"),
        ("features.mean_norm=false", "config key features.mean_norm: False in the config, True in {src}"),
        ("features.frame_shift_ms=20", "config key features.frame_shift_ms: 20.0 in the config, 10.0 in {src}"),
        ("data.sample_rate=8000", "config key data.sample_rate: 8000 in the config, 16000 in {src}"),
    ],
)
def test_a_conflicting_section_is_an_error_naming_the_key(pretrained, tmp_path, capsys, override, message):
    config = write_config(tmp_path, new_data(tmp_path), train={"init": str(pretrained)})
    exp = tmp_path / "ft"
    assert train_main(["--config", config, "--exp-dir", str(exp), override]) == 2
    src = pretrained / "checkpoints" / "epoch_001.pt"
    assert message.format(src=src) in capsys.readouterr().err
    assert not exp.exists()


def test_an_agreeing_model_section_is_accepted(pretrained, tmp_path):
    source = load_checkpoint(pretrained / "checkpoints" / "epoch_001.pt")
    model = {"name": "campplus", "args": {"embedding_size": 32, "feat_dim": 80}}  # feat_dim: the default
    config = write_config(tmp_path, new_data(tmp_path), train={"init": str(pretrained)}, model=model)
    cfg, _ = load_train_config([config], [], None)
    assert cfg.model.name == "campplus" and cfg.model.args == {**source.model_args, "feat_dim": 80}


def test_param_groups_scale_the_trunk_only(pretrained, tmp_path):
    config = write_config(tmp_path, new_data(tmp_path), train={"init": str(pretrained)})
    cfg, init = load_train_config([config], ["optim.backbone_lr_scale=0.1"], None)
    run = build_run(cfg, tmp_path / "x", init)
    trunk = {id(p) for p in run.raw.model.parameters()}
    for group in run.optimizer.param_groups:
        in_trunk = {id(p) in trunk for p in group["params"]}
        assert len(in_trunk) == 1 and group["lr_scale"] == (0.1 if in_trunk == {True} else 1.0)
    # With every scale 1: the two groups (decayed, not) of every earlier run, in the same parameter order.
    one = parameter_groups(run.raw.model, run.raw.classifier, load_train_config([config], [], None)[0].optim)
    assert [len(g["params"]) for g in one] == [
        sum(p.ndim > 1 for p in run.raw.parameters()),
        sum(p.ndim <= 1 for p in run.raw.parameters()),
    ]
    assert len(build_optimizer(load_train_config([config], [], None)[0], run.raw).param_groups) == 2


def test_lower_trunk_lr_is_applied(pretrained, tmp_path):
    config = write_config(tmp_path, new_data(tmp_path), train={"init": str(pretrained)})
    exp = tmp_path / "ft"
    assert train_main(["--config", config, "--exp-dir", str(exp), "optim.backbone_lr_scale=0.25"]) == 0
    groups = load_checkpoint(exp / "checkpoints" / "epoch_002.pt").resume.optimizer["param_groups"]
    last_lr = {g["lr_scale"]: g["lr"] for g in groups}
    assert set(last_lr) == {0.25, 1.0} and last_lr[0.25] == pytest.approx(0.25 * last_lr[1.0])


def test_frozen_trunk_stays_the_pretrained_one_then_trains(pretrained, tmp_path):
    config = write_config(tmp_path, new_data(tmp_path), train={"init": str(pretrained), "freeze": TRUNK_EPOCH_1})
    exp = tmp_path / "ft"
    assert train_main(["--config", config, "--exp-dir", str(exp)]) == 0
    source = load_checkpoint(pretrained / "checkpoints" / "epoch_001.pt").model
    e1, e2 = (load_checkpoint(exp / "checkpoints" / f"epoch_00{n}.pt") for n in (1, 2))
    for key, value in source.items():  # weights and BatchNorm statistics alike
        torch.testing.assert_close(e1.model[key], value, rtol=0, atol=0, msg=key)
    changed = [k for k, v in source.items() if v.is_floating_point() and not torch.equal(e2.model[k], v)]
    assert len(changed) > len(source) // 2
    log = (exp / "train.log").read_text()
    assert "step 0: frozen: trunk until step 2" in log and "step 2: nothing frozen" in log


def test_fine_tuning_resumes_exactly(pretrained, tmp_path):
    """Interrupted in the frozen epoch and again after it: the same losses as one uninterrupted run."""
    config = write_config(
        tmp_path,
        new_data(tmp_path),
        train={"init": str(pretrained), "freeze": TRUNK_EPOCH_1},
        optim={"backbone_lr_scale": 0.5},
    )
    assert train_main(["--config", config, "--exp-dir", str(tmp_path / "a")]) == 0
    for steps in ("1", "2"):
        assert train_main(["--config", config, "--exp-dir", str(tmp_path / "b"), "--max-steps", steps]) == 0
    assert train_main(["--config", config, "--exp-dir", str(tmp_path / "b")]) == 0
    a, b = losses(tmp_path / "a"), losses(tmp_path / "b")
    assert sorted(a) == sorted(b) == [1, 2, 3, 4]
    for step in a:
        assert b[step] == pytest.approx(a[step], rel=1e-6, abs=1e-7), step
    log = (tmp_path / "b" / "train.log").read_text()
    assert log.count("initialised from") == 1 and "resumed from" in log
    wa = load_checkpoint(tmp_path / "a" / "checkpoints" / "epoch_002.pt").model
    wb = load_checkpoint(tmp_path / "b" / "checkpoints" / "epoch_002.pt").model
    for key in wa:
        torch.testing.assert_close(wa[key], wb[key], rtol=1e-6, atol=1e-7)


def test_changed_trunk_schedule_is_refused_on_resume(pretrained, tmp_path, capsys):
    config = write_config(tmp_path, new_data(tmp_path), train={"init": str(pretrained), "freeze": TRUNK_EPOCH_1})
    exp = tmp_path / "ft"
    assert train_main(["--config", config, "--exp-dir", str(exp), "--max-steps", "1"]) == 0
    assert train_main(["--config", config, "--exp-dir", str(exp), "train.freeze=[]"]) == 2
    stored = "[{'modules': ['trunk'], 'until_epoch': 1, 'until_step': None}]"
    assert f"train.freeze: {stored} in the checkpoint -> [] now" in capsys.readouterr().err
    same = "train.freeze=[{modules: [trunk], until_epoch: 1}]"  # the same freeze written out: resumes
    assert train_main(["--config", config, "--exp-dir", str(exp), same]) == 0


# ---------------------------------------------------------------- other sources


def threedspeaker_file(tmp_path) -> tuple:
    """A 3D-Speaker CAM++ (192-D) state dict filled by tests/test_compat.py's rule, saved as the zoo's
    training scripts nest it (`{"state_dict": {"module.<key>": tensor}}`)."""
    state = fill_state_dict(load_fixture("campplus")["state_dict"])
    path = tmp_path / "campplus_zoo.bin"
    torch.save({"state_dict": {f"module.{k}": v for k, v in state.items()}}, path)
    return path, state


@pytest.mark.slow
def test_fine_tune_from_a_3dspeaker_state_dict_and_resume(tmp_path):
    path, state = threedspeaker_file(tmp_path)
    train = {"init": str(path), "init_3dspeaker": "campplus", "freeze": TRUNK_EPOCH_1, "save_every_steps": 1}
    config = write_config(tmp_path, new_data(tmp_path), train=train, data={"crop_seconds": 0.3})
    small = ["train.global_batch_size=4", "hardware.per_device_batch=4"]  # 4 steps an epoch, 8 in all
    a, b = tmp_path / "a", tmp_path / "b"
    assert train_main(["--config", config, "--exp-dir", str(a), *small]) == 0
    assert train_main(["--config", config, "--exp-dir", str(b), *small, "--max-steps", "5"]) == 0
    assert train_main(["--config", config, "--exp-dir", str(b), *small]) == 0
    la, lb = losses(a), losses(b)
    assert sorted(la) == sorted(lb) == list(range(1, 9))
    for step in la:
        assert lb[step] == pytest.approx(la[step], rel=1e-5, abs=1e-6), step
    saved = yaml.safe_load((b / "config.yaml").read_text())["model"]
    assert saved == {"name": "campplus", "args": {"embedding_size": 192}}
    start = load_checkpoint(b / "pretrained.pt").model
    for key, value in state.items():
        torch.testing.assert_close(start[key], value, rtol=0, atol=0)
    log = (b / "train.log").read_text()
    assert "initialised from" in log and "resumed from" in log


def test_3dspeaker_weights_that_do_not_fit_are_named(tmp_path, capsys):
    path, _ = threedspeaker_file(tmp_path)
    train = {"init": str(path), "init_3dspeaker": "campplus"}
    config = write_config(tmp_path, new_data(tmp_path), train=train, model={"args": {"num_layers": [1, 1, 1]}})
    assert train_main(["--config", config, "--exp-dir", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert f"config key 'train.init': the weights of {path} do not fit model campplus" in err
    assert "(set model.args to the release's, e.g. model.args.embedding_size)" in err and "unexpected xvector" in err


def redimnet_release(tmp_path, size="b0") -> tuple:
    """A ReDimNet2 release file: the fixture's model_config and a state dict filled by the compat rule, with a
    front-end buffer (`spec.*`) as the releases carry."""
    fixture = load_redimnet2_fixture(size)
    state = fill_state_dict(fixture["state_dict"])
    n = zlib.crc32(b"spec") % 7 + 1
    path = tmp_path / f"redimnet2_{size}.pt"
    torch.save({"model_config": fixture["reference_kwargs"], "state_dict": {**state, "spec.mel": torch.ones(n)}}, path)
    return path, state


def test_redimnet2_release_gives_the_registered_size_and_its_front_end(tmp_path):
    path, state = redimnet_release(tmp_path)
    src = read_source(str(path))
    assert (src.kind, src.model_name) == ("redimnet2", "redimnet2_b0")
    assert src.features == FeatureSpec(ReDimNetMelConfig(), mean_norm=True)  # the release's own log-mel
    assert src.model_args == {
        "feat_dim": 72,
        "embedding_size": 192,
        "out_channels": 64,
        "return_2d_output": True,
        "agg_gnorm": False,
    }
    run = fresh_run(write_config(tmp_path, new_data(tmp_path), train={"init": str(path)}), tmp_path / "r")
    loaded = run.raw.model.state_dict()  # once: state_dict() builds the whole dict on every call
    for key, value in state.items():
        torch.testing.assert_close(loaded[key], value, rtol=0, atol=0)
    f = run.cfg.features
    assert (f.kind, f.num_mel_bins, f.fft_size, f.high_freq, f.normalize_signal) == (
        "redimnet_mel",
        72,
        512,
        7600,
        True,
    )
    features = {"num_mel_bins": 80}  # a key given that disagrees with the release
    with pytest.raises(ConfigError, match=r"config key features.num_mel_bins: 80 in the config, 72 in"):
        load_train_config(
            [write_config(tmp_path, new_data(tmp_path), train={"init": str(path)}, features=features)], [], None
        )


def test_cnc2_release_maps_to_agg_gnorm(tmp_path):
    path, _ = redimnet_release(tmp_path, "b3_vb2_vox2_cnc2")
    src = read_source(str(path))
    assert src.model_name == "redimnet2_b3" and src.model_args["agg_gnorm"] is True
    np.testing.assert_equal(src.model_args["out_channels"], 224)


@pytest.mark.slow
def test_frozen_trunk_under_torchrun(pretrained, tmp_path):
    """Two processes: DDP reduces the classifier alone while the trunk is frozen, and the trunk once it thaws
    (the wrapper is rebuilt then); the frozen epoch leaves the trunk as it was; the trunk's lower LR holds
    under the wrapper."""
    train = {"init": str(pretrained), "freeze": TRUNK_EPOCH_1}
    config = write_config(tmp_path, new_data(tmp_path), train=train, optim={"backbone_lr_scale": 0.25})
    exp = tmp_path / "ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}", "-m"]
    cmd += ["speakerlab.train", "--config", config, "--exp-dir", str(exp)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    log = (exp / "train.log").read_text()
    assert_no_traceback(r.stdout, r.stderr, log)
    assert "training done: 2 epochs, 4 steps" in log and "step 2: nothing frozen" in log  # and DDP wrapped again
    source = load_checkpoint(pretrained / "checkpoints" / "epoch_001.pt").model
    e1, e2 = (load_checkpoint(exp / "checkpoints" / f"epoch_00{n}.pt").model for n in (1, 2))
    assert all(torch.equal(e1[k], v) for k, v in source.items())
    assert sum(not torch.equal(e2[k], v) for k, v in source.items() if v.is_floating_point()) > len(source) // 2
    groups = load_checkpoint(exp / "checkpoints" / "epoch_002.pt").resume.optimizer["param_groups"]
    last_lr = {g["lr_scale"]: g["lr"] for g in groups}
    assert set(last_lr) == {0.25, 1.0} and last_lr[0.25] == pytest.approx(0.25 * last_lr[1.0])
