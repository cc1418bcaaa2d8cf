"""The catalogue of bad inputs and faults: each case asserts the exit code, the message naming the file,
line or config key, and that nothing was lost (the exp dir, checkpoints and outputs as they were).

Scoring's bad inputs (ids without embeddings, empty or one-class lists, mixed dimensions, malformed
lines, NaN embeddings) are in tests/test_score.py; list parsing's in tests/test_lists.py.
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from speakerlab.checkpoint import Checkpoint, CheckpointError, load_checkpoint, save_checkpoint
from speakerlab.dataio.tables.prepare import main as prepare_main
from speakerlab.dataio.waveform.noise_bank import main as bank_main
from speakerlab.frontends import FeatureSpec
from speakerlab.inference.cli import run_verify
from speakerlab.inference.extract import main as extract_main
from speakerlab.models import build_model
from speakerlab.train.loop import main as train_main
from speakerlab.train.state.average import main as average_main
from tests.helpers import LAST_STAGE, ROOT, damaged_copy, make_data_dir, tiny_config, write_wav
from tests.helpers import TINY_CAMPPLUS as TINY


def snapshot(folder: Path) -> dict:
    """name -> bytes of every file under `folder` (what "nothing lost or changed" compares)."""
    return (
        {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
        if folder.exists()
        else {}
    )


@pytest.fixture
def trained(tiny_model):
    """(config, train dir, exp dir) of the session's tiny model trained one epoch (tests/conftest.py); the cases
    that change the exp dir copy it."""
    return tiny_model


def copy_exp(trained, tmp_path) -> Path:
    exp = tmp_path / "exp"
    shutil.copytree(trained[2], exp)
    return exp


# ---------------------------------------------------------------- training: config and command line


@pytest.mark.parametrize(
    "args, message",
    [
        (["train.keep_checkpoints=0"], "config key 'train.keep_checkpoints' must be >= 1, got 0"),
        (["train.keep_checkpoints=-1"], "config key 'train.keep_checkpoints' must be >= 1, got -1"),
        (["train.log_every_steps=0"], "config key 'train.log_every_steps' must be >= 1, got 0"),
        (["train.val_every=0"], "config key 'train.val_every' must be >= 1, got 0"),
        (["optim.min_lr=-0.5"], "config key 'optim.min_lr' must be >= 0, got -0.5"),
        (["optim.min_lr=0.5"], "config key 'optim.min_lr' (0.5) must be <= optim.lr (0.05)"),
        (["optim.name=sgd", "optim.momentum=0"], "config key 'optim.nesterov': Nesterov momentum needs optim.momentum"),
        (["train.epocs=1"], "unknown config key 'train.epocs'"),
        (["train.epochs=two"], "config key 'train.epochs' must be an integer, got 'two' in the command-line overrides"),
        (["model.args.embeding_size=8"], "config key 'model.args.embeding_size': model 'campplus' has no argument"),
        (["model.args.growth_rate=2.5"], "config key 'model.args.growth_rate' must be an integer, got 2.5"),
        (["model.args.num_layers=5"], "config key 'model.args.num_layers' must be a list, got 5"),
        (["model.args.memory_efficient=3"], "config key 'model.args.memory_efficient' must be true/false, got 3"),
        (["model.args.embedding_size=-5"], "model campplus does not work with them: Trying to create tensor with"),
        (["model.args.num_layers=[1, 1]"], "model campplus does not work with them: AssertionError"),
        (["model.args.seg_len=0"], "model campplus does not work with them: integer division or modulo by zero"),
        (["model.args.embedding_size=0"], "model campplus does not work with them: its embeddings have 0 dimensions"),
        (["hardware.per_device_batch=big"], "config key 'hardware.per_device_batch' must be an integer or 'auto'"),
        (["augment.speed_prob=2"], "config key 'augment.speed_prob' must be in [0, 1], got 2.0"),
        (["--hardware", "tpu-9000"], "unknown hardware profile 'tpu-9000'"),
    ],
)
def test_bad_setting_stops_before_anything_is_written(trained, tmp_path, capsys, args, message):
    exp = tmp_path / "new"
    assert train_main(["--config", str(trained[0]), "--exp-dir", str(exp), *args]) == 2
    assert message in capsys.readouterr().err
    assert not exp.exists()


def test_max_steps_zero_is_refused(trained, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        train_main(["--config", str(trained[0]), "--exp-dir", str(tmp_path / "x"), "--max-steps", "0"])
    assert e.value.code == 2 and "--max-steps: must be >= 1, got 0" in capsys.readouterr().err


def test_yaml_error_names_file_and_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  name: campplus\ndata: {train: x}}\n")
    assert train_main(["--config", str(bad), "--exp-dir", str(tmp_path / "x")]) == 2
    assert f"{bad}:3: invalid YAML" in capsys.readouterr().err


# ---------------------------------------------------------------- training: data


def test_missing_wav_named_with_its_line(trained, tmp_path, capsys):
    cfg, train = tiny_config(tmp_path, val=False)
    (train / "wav" / "s1-2.wav").unlink()
    assert train_main(["--config", str(cfg), "--exp-dir", str(tmp_path / "x")]) == 2
    assert f"{train / 'wav.scp'}:7: {train / 'wav' / 's1-2.wav'}" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_non_utf8_list_named_with_its_line(tmp_path, capsys):
    cfg, train = tiny_config(tmp_path, val=False)
    with open(train / "utt2spk", "ab") as f:
        f.write(b"s9-0 caf\xe9\n")
    assert train_main(["--config", str(cfg), "--exp-dir", str(tmp_path / "x")]) == 2
    assert f"{train / 'utt2spk'}:17: not UTF-8 text" in capsys.readouterr().err


def test_utt2spk_entry_without_audio_named(tmp_path, capsys):
    cfg, train = tiny_config(tmp_path, val=False)
    with open(train / "utt2spk", "a") as f:
        f.write("s9-0 s9\n")
    assert train_main(["--config", str(cfg), "--exp-dir", str(tmp_path / "x")]) == 2
    assert f"{train / 'utt2spk'}:17: utterance 's9-0' is not in wav.scp" in capsys.readouterr().err


def test_fewer_utterances_than_one_global_batch_names_the_key(tmp_path, capsys):
    """16 utterances and a global batch of 32: not one step of an epoch; the error names the key that decides it."""
    cfg, _ = tiny_config(tmp_path, val=False)
    args = ["train.global_batch_size=32", "hardware.per_device_batch=8"]
    assert train_main(["--config", str(cfg), "--exp-dir", str(tmp_path / "x"), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        "error: config key 'train.global_batch_size' (32): 16 training utterances are fewer than one global batch "
        "(32) of data.train: lower it or train on more utterances"
    ), err


def test_stale_length_index_found_at_start(tmp_path, capsys):
    cfg, train = tiny_config(tmp_path, val=False)
    assert prepare_main(["--data", str(train)]) == 0
    write_wav(train / "wav" / "s0-0.wav", np.zeros(4000))  # shorter than utt2num_samples says
    assert train_main(["--config", str(cfg), "--exp-dir", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert f"{train / 'utt2num_samples'}: 's0-0' says 9600 samples, the file has 4000" in err
    assert "re-run the features stage" in err and not (tmp_path / "x").exists()


def test_stale_entry_outside_the_start_check_is_one_clear_error(tmp_path, capsys, monkeypatch):
    """A stale length the start-up sample missed: the crop read fails mid-epoch; the error names the file,
    says what to do, and the checkpoints before it stay."""
    import speakerlab.train.inputs.loader as setup

    monkeypatch.setattr(setup, "SPOT_CHECKS", 1)  # only the first and the last utterance are checked
    cfg, train = tiny_config(tmp_path, val=False)
    assert prepare_main(["--data", str(train)]) == 0
    write_wav(train / "wav" / "s2-1.wav", np.zeros(4000))
    assert train_main(["--config", str(cfg), "--exp-dir", str(tmp_path / "x"), "data.on_bad_audio=stop"]) == 2
    err = capsys.readouterr().err
    assert f"error: {train / 'wav' / 's2-1.wav'}: truncated file" in err and "re-run the features stage" in err
    assert "Traceback" not in err


def test_unreadable_utterance_skipped_counted_and_named(tmp_path, capsys, monkeypatch):
    """data.on_bad_audio skip (the default): an utterance that fails to read mid-epoch leaves its batch,
    every failed read is named and counted, and training finishes; past data.max_bad_audio it stops."""
    import speakerlab.train.inputs.loader as setup

    monkeypatch.setattr(setup, "SPOT_CHECKS", 1)
    cfg, train = tiny_config(tmp_path, val=False)
    assert prepare_main(["--data", str(train)]) == 0
    broken = train / "wav" / "s2-1.wav"
    broken.write_bytes(b"RIFF\0\0\0\0WAVEjunk")  # the header check at start-up misses it (SPOT_CHECKS)
    assert train_main(["--config", str(cfg), "--exp-dir", str(tmp_path / "x")]) == 0
    log = (tmp_path / "x" / "train.log").read_text()
    named = [line for line in log.splitlines() if "skipped an unreadable training utterance" in line]
    epochs = int(re.search(r"training done: (\d+) epochs", log).group(1))
    assert len(named) == epochs  # read once per epoch, skipped each time
    assert all(str(broken) in line for line in named) and f"({epochs} so far)" in named[-1]
    assert f"{epochs} unreadable utterance reads skipped" in log
    over = ["--config", str(cfg), "--exp-dir", str(tmp_path / "y"), "data.max_bad_audio=0"]
    assert train_main(over) == 3
    err = capsys.readouterr().err
    assert "1 training reads failed, more than data.max_bad_audio (0)" in err and str(broken) in err


def test_wrong_sample_rate_setting_found_at_start(tmp_path, capsys):
    cfg, train = tiny_config(tmp_path, val=False)
    assert prepare_main(["--data", str(train)]) == 0
    assert train_main(["--config", str(cfg), "--exp-dir", str(tmp_path / "x"), "data.sample_rate=8000"]) == 2
    err = capsys.readouterr().err
    assert f"{train / 'wav.scp'}:1:" in err and "sample rate 16000 Hz, expected 8000 Hz" in err
    assert "config key 'data.sample_rate' is 8000" in err


def test_nan_noise_file_is_named_when_the_bank_is_built(tmp_path, capsys):
    lists = tmp_path / "lists"
    lists.mkdir()
    good = write_wav(tmp_path / "n0.wav", 0.1 * np.random.default_rng(0).standard_normal(8000))
    bad = write_wav(tmp_path / "n1.wav", np.full(8000, np.nan, np.float32), subtype="FLOAT")
    (lists / "noise.scp").write_text(f"n0 {good}\nn1 {bad}\n")
    assert bank_main(["--lists", str(lists), "--kinds", "noise"]) == 2
    assert f"{lists / 'noise.scp'}:2: {bad}: non-finite samples" in capsys.readouterr().err
    assert not (lists / "bank").exists() or not list((lists / "bank").glob("*.npy"))


# ---------------------------------------------------------------- training: exp dir and resume


def test_changed_global_batch_is_refused_and_nothing_changes(trained, tmp_path, capsys):
    exp = copy_exp(trained, tmp_path)
    before = snapshot(exp)
    assert (
        train_main(
            [
                "--config",
                str(trained[0]),
                "--exp-dir",
                str(exp),
                "train.global_batch_size=4",
                "hardware.per_device_batch=4",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "train.global_batch_size: 8 in the checkpoint -> 4 now" in err and "--force-new-schedule" in err
    assert snapshot(exp) == before  # config.yaml, train.log, checkpoints: untouched


def test_another_front_end_is_refused_on_resume_and_nothing_changes(trained, tmp_path, capsys):
    """The weights learnt on the checkpoint's features: another front-end (mel edges here) is refused as another
    model.args is; it continued silently, and the checkpoints then claimed a front-end their first steps never saw."""
    exp = copy_exp(trained, tmp_path)
    before = snapshot(exp)
    args = ["--config", str(trained[0]), "--exp-dir", str(exp), "features.low_freq=300"]
    assert train_main(args) == 2
    err = capsys.readouterr().err
    assert "features.low_freq: 20.0 in the checkpoint -> 300.0 now" in err and "--force-new-schedule" in err
    assert snapshot(exp) == before
    assert train_main([*args, "train.epochs=2", "--force-new-schedule"]) == 0
    log = (exp / "train.log").read_text()
    assert "features.low_freq: 20.0 in the checkpoint -> 300.0 now; epoch 2 starts again" in log


def test_a_longer_schedule_is_refused_in_one_line_naming_the_flag_and_how_recipes_pass_it(trained, tmp_path, capsys):
    exp = copy_exp(trained, tmp_path)
    assert train_main(["--config", str(trained[0]), "--exp-dir", str(exp), "train.epochs=3"]) == 2
    err = capsys.readouterr().err  # the log of the start, then the one error line
    assert "Traceback" not in err and err.splitlines()[-1] == (
        f"error: {exp} was trained with other settings than this command's (train.epochs: 1 in the checkpoint -> 3 "
        "now): resuming would continue a different schedule or data order; run the original command, use a new "
        "--exp-dir, or pass --force-new-schedule (a recipe: add it to --train_overrides) to continue these weights "
        "under the new settings"
    )


def test_a_changed_speaker_list_is_one_line_saying_how_many_speakers_differ(trained, tmp_path, capsys):
    """The training folder changed (a speaker added, one gone) under the same exp dir: not a traceback, one line
    naming the checkpoint, the counts, and the flag that fixes it; nothing in the exp dir changes."""
    exp = copy_exp(trained, tmp_path)
    train = make_data_dir(tmp_path / "train", {f"s{s}-{u}": f"s{s}" for s in (1, 2, 3, 4) for u in range(4)}, 0.6)
    before = snapshot(exp)
    assert train_main(["--config", str(trained[0]), "--exp-dir", str(exp), f"data.train={train}"]) == 2
    err = capsys.readouterr().err
    # data.train itself is a schedule setting: with --force-new-schedule the speaker list is what stops it.
    assert "data.train:" in err and "--force-new-schedule" in err
    argv = ["--config", str(trained[0]), "--exp-dir", str(exp), f"data.train={train}", "--force-new-schedule"]
    assert train_main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.splitlines()[-1] == (
        f"error: {exp / 'checkpoints' / 'epoch_001.pt'} was trained on another speaker list than {train} holds now: "
        "1 of its 4 speakers are gone (e.g. 's0'), 1 of the 4 now are new (e.g. 's4') (the training data changed "
        f"since); use a new --exp-dir (a recipe's --exp DIR), or delete {exp} to start that run again"
    )
    assert snapshot(exp) == before


def test_x100_learning_rate_is_refused(trained, tmp_path, capsys):
    exp = copy_exp(trained, tmp_path)
    assert train_main(["--config", str(trained[0]), "--exp-dir", str(exp), "optim.lr=5.0"]) == 2
    assert "optim.lr: 0.05 in the checkpoint -> 5.0 now" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["last", "first", "between overrides"])
def test_force_new_schedule_continues_the_weights(trained, tmp_path, where):
    """The flag and the dotted overrides in any order (as a recipe's --train_overrides passes them)."""
    exp = copy_exp(trained, tmp_path)
    flag, options = ["--force-new-schedule"], ["--config", str(trained[0]), "--exp-dir", str(exp)]
    argv = {
        "last": [*options, "train.epochs=2", "optim.lr=0.02", *flag],
        "first": [*flag, "train.epochs=2", *options, "optim.lr=0.02"],
        "between overrides": [
            "--config",
            str(trained[0]),
            "train.epochs=2",
            *flag,
            "optim.lr=0.02",
            "--exp-dir",
            str(exp),
        ],
    }[where]
    assert train_main(argv) == 0
    log = (exp / "train.log").read_text()
    assert "--force-new-schedule: train.epochs: 1 in the checkpoint -> 2 now" in log
    assert load_checkpoint(exp / "checkpoints" / "epoch_002.pt").step == 4


def test_second_run_on_a_locked_exp_dir_is_refused(trained, tmp_path, capsys):
    exp = copy_exp(trained, tmp_path)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        (exp / ".lock").write_text(f"{os.uname().nodename} {sleeper.pid} 2026-01-01 00:00:00\n")
        before = snapshot(exp)
        assert train_main(["--config", str(trained[0]), "--exp-dir", str(exp), "train.epochs=1"]) == 2
        assert f"{exp} is in use by process {sleeper.pid} on this machine" in capsys.readouterr().err
        assert snapshot(exp) == before
    finally:
        sleeper.kill()
        sleeper.wait()


def test_stale_lock_and_temp_files_of_a_dead_run_are_cleared(trained, tmp_path):
    exp = copy_exp(trained, tmp_path)
    dead = subprocess.Popen(["true"])
    dead.wait()
    (exp / ".lock").write_text(f"{os.uname().nodename} {dead.pid} 2026-01-01 00:00:00\n")
    torn = exp / "checkpoints" / ".partial_002.pt.tmp99999"
    torn.write_bytes(b"half")
    assert train_main(["--config", str(trained[0]), "--exp-dir", str(exp), "train.epochs=1"]) == 0
    log = (exp / "train.log").read_text()
    assert f"removing the stale lock {exp / '.lock'} of process {dead.pid}" in log
    assert f"removed {torn}, left mid-write" in log
    assert not torn.exists() and not (exp / ".lock").exists()


def test_corrupt_newest_checkpoint_is_reported_and_the_previous_one_resumed(trained, tmp_path):
    exp = copy_exp(trained, tmp_path)
    good = exp / "checkpoints" / "epoch_001.pt"
    newer = exp / "checkpoints" / "partial_002.pt"
    damaged_copy(good, newer, b"\x00")
    assert train_main(["--config", str(trained[0]), "--exp-dir", str(exp), "train.epochs=1"]) == 0
    log = (exp / "train.log").read_text()
    assert f"checkpoint {newer} is corrupt" in log or f"checkpoint {newer} cannot be loaded" in log
    assert f"resumed from {good}" in log


def test_every_checkpoint_corrupt_stops_with_their_names(trained, tmp_path, capsys):
    exp = copy_exp(trained, tmp_path)
    ck = exp / "checkpoints" / "epoch_001.pt"
    ck.write_bytes(ck.read_bytes()[:500])
    assert train_main(["--config", str(trained[0]), "--exp-dir", str(exp), "train.epochs=1"]) == 3
    assert f"no intact checkpoint in {exp / 'checkpoints'}" in capsys.readouterr().err and ck.exists()


def test_failed_start_keeps_the_exp_dir_config(trained, tmp_path, capsys):
    exp = copy_exp(trained, tmp_path)
    before = (exp / "config.yaml").read_text()
    assert train_main(["--config", str(trained[0]), "--exp-dir", str(exp), "data.train=/nonexistent"]) == 2
    assert "/nonexistent: data dir does not exist" in capsys.readouterr().err
    assert (exp / "config.yaml").read_text() == before


def test_full_disk_leaves_no_partial_checkpoint(tmp_path, monkeypatch):
    model = build_model("campplus", **TINY)
    ck = Checkpoint(model_name="campplus", model_args=TINY, model=model.state_dict(), features=FeatureSpec())

    def no_space(obj, f):
        f.write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", no_space)
    with pytest.raises(CheckpointError, match="No space left on device; the previous checkpoints are intact"):
        save_checkpoint(tmp_path / "epoch_001.pt", ck)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- training: train.init (a pretrained model)


def _init_cases(trained, tmp_path):
    """(overrides, message) of each bad train.init; the files they name are written here."""
    ckpt = trained[2] / "checkpoints" / "epoch_001.pt"
    plain = tmp_path / "plain.pt"
    torch.save(load_checkpoint(ckpt).model, plain)  # the same weights as a bare state dict
    corrupt = damaged_copy(ckpt, tmp_path / "corrupt.pt")
    return {
        "missing": (
            [f"train.init={tmp_path / 'nope.pt'}"],
            f"config key 'train.init': checkpoint {tmp_path / 'nope.pt'} ",
        ),
        "plain state dict": (
            [f"train.init={plain}"],
            f"config key 'train.init': {plain}: not a speakerlab checkpoint (no model_name/model) nor a ReDimNet2",
        ),
        "corrupt": ([f"train.init={corrupt}"], f"config key 'train.init': checkpoint {corrupt} "),
        "ours as 3D-Speaker": (
            [f"train.init={ckpt}", "train.init_3dspeaker=campplus"],
            f"config key 'train.init_3dspeaker': {ckpt} is a speakerlab checkpoint, not a 3D-Speaker state dict",
        ),
        "unknown 3D-Speaker model": (
            [f"train.init={plain}", "train.init_3dspeaker=nope"],
            "config key 'train.init_3dspeaker': unknown model 'nope'",
        ),
        "3D-Speaker rows": (
            [f"train.init={plain}", "train.init_3dspeaker=campplus", "train.init_match_speakers=true"],
            f"config key 'train.init_match_speakers': {plain} has no classifier",
        ),
        "freeze without init": (
            ["train.freeze=[{modules: [trunk], until_epoch: 1}]"],
            "config key 'train.freeze[0].modules' (trunk): trunk needs train.init",
        ),
        "freeze past the end": (
            [f"train.init={ckpt}", "train.freeze=[{modules: [trunk], until_epoch: 3}]"],
            "config key 'train.freeze[0].until_epoch' (3) must be <= train.epochs (2)",
        ),
        "freeze by an old key": (
            [f"train.init={ckpt}", "train.freeze_epochs=1"],
            "config key 'train.freeze_epochs' was replaced by 'train.freeze': freeze_epochs: 1 is written freeze: "
            "[{modules: [trunk], until_epoch: 1}]",
        ),
        "rows without init": (
            ["train.init_match_speakers=true"],
            "config key 'train.init_match_speakers' (True) needs",
        ),
        "bad LR scale": (["optim.backbone_lr_scale=0"], "config key 'optim.backbone_lr_scale' must be > 0, got 0.0"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "missing",
        "plain state dict",
        "corrupt",
        "ours as 3D-Speaker",
        "unknown 3D-Speaker model",
        "3D-Speaker rows",
        "freeze without init",
        "freeze past the end",
        "freeze by an old key",
        "rows without init",
        "bad LR scale",
    ],
)
def test_bad_init_stops_before_anything_is_written(trained, tmp_path, capsys, case):
    overrides, message = _init_cases(trained, tmp_path)[case]
    exp = tmp_path / "new"
    assert train_main(["--config", str(trained[0]), "--exp-dir", str(exp), *overrides]) == 2
    assert message in capsys.readouterr().err
    assert not exp.exists()


def test_text_file_as_pretrained_model_says_what_it_is_and_never_advises_weights_only_false(trained, tmp_path, capsys):
    notes = tmp_path / "campplus.bin"
    notes.write_text("model card: CAM++ trained on ...\n")
    for threedspeaker in ([], ["train.init_3dspeaker=campplus"]):
        argv = ["--config", str(trained[0]), "--exp-dir", str(tmp_path / "new"), f"train.init={notes}"]
        assert train_main([*argv, *threedspeaker]) == 2
        err = capsys.readouterr().err
        assert err == (
            f"error: config key 'train.init': checkpoint {notes} cannot be loaded: it is a text file, not a PyTorch "
            "weights file (torch.save writes a zip archive or a pickle)\n"
        )
        assert "weights_only" not in err and not (tmp_path / "new").exists()


def test_check_loads_config_and_init_and_touches_nothing(trained, tmp_path, capsys):
    """`speakerlab-train --check`: the recipes' pre-flight. Overrides anywhere on the line; a bad init, a bad
    setting or an exp dir that cannot be made is the same one line as a real start; the exp dir is not made."""
    ckpt = trained[2] / "checkpoints" / "epoch_001.pt"
    exp = tmp_path / "deep" / "exp"
    argv = ["--config", str(trained[0]), f"train.init={ckpt}", "--exp-dir", str(exp), "--check", "train.epochs=3"]
    assert train_main(argv) == 0
    assert f"config ok, model campplus (train.init {ckpt}), exp dir {exp} usable" in capsys.readouterr().out
    assert not (tmp_path / "deep").exists()
    (tmp_path / "a file").write_text("x")
    cases = {
        f"train.init={tmp_path / 'nope.pt'}": f"config key 'train.init': checkpoint {tmp_path / 'nope.pt'} does not",
        "train.epochs=0": "config key 'train.epochs' must be >= 1, got 0",
        f"data.train={tmp_path / 'a file'}": f"error: {tmp_path / 'a file'} is a file, not a folder",
    }
    for override, message in cases.items():
        assert train_main(["--check", "--config", str(trained[0]), "--exp-dir", str(exp), override]) == 2
        assert message in capsys.readouterr().err
    assert train_main(["--check", "--config", str(trained[0]), "--exp-dir", str(tmp_path / "a file" / "exp")]) == 2
    assert (
        f"error: {tmp_path / 'a file'} is a file, not a folder (so {tmp_path / 'a file' / 'exp'} cannot be made)"
        in (capsys.readouterr().err)
    )
    assert not (tmp_path / "deep").exists()


def test_check_refuses_an_exp_dir_the_run_would_not_resume(trained, tmp_path, capsys):
    """--check said 'exp dir ... usable' for a run's exp dir the run itself then refused (other settings than its
    checkpoint's); now the same line as the run's refusal, and --force-new-schedule lets both through."""
    exp = copy_exp(trained, tmp_path)
    before = snapshot(exp)
    argv = ["--check", "--config", str(trained[0]), "--exp-dir", str(exp), "train.epochs=3"]
    assert train_main(argv) == 2
    err = capsys.readouterr().err
    assert f"error: {exp} was trained with other settings than this command's (train.epochs: 1 in the checkpoint" in err
    assert train_main([*argv, "--force-new-schedule"]) == 0
    assert train_main([*argv, "train.epochs=1"]) == 0 and f"exp dir {exp} usable" in capsys.readouterr().out
    assert snapshot(exp) == before


def test_no_model_and_no_init_is_named(trained, tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"data: {{train: {trained[1]}}}\n")
    assert train_main(["--config", str(cfg), "--exp-dir", str(tmp_path / "x")]) == 2
    assert "config key 'model.name' is required (or train.init, a pretrained model to take it from)" in (
        capsys.readouterr().err
    )


# ---------------------------------------------------------------- averaging


@pytest.mark.parametrize("last", ["0", "-2"])
def test_average_last_must_be_positive(trained, tmp_path, capsys, last):
    exp = copy_exp(trained, tmp_path)
    with pytest.raises(SystemExit) as e:
        average_main(["--exp-dir", str(exp), "--last", last])
    assert e.value.code == 2 and f"--last must be >= 1, got {last}" in capsys.readouterr().err
    assert not (exp / "checkpoints" / "avg.pt").exists()


def test_average_without_checkpoints_is_named(tmp_path, capsys):
    assert average_main(["--exp-dir", str(tmp_path)]) == 2
    assert f"no epoch checkpoints under {tmp_path}/checkpoints" in capsys.readouterr().err


def _average_case(exp, case):
    """Damage the newest of two epoch checkpoints of `exp` as `case` says; returns what the error names."""
    first, second = exp / "checkpoints" / "epoch_001.pt", exp / "checkpoints" / "epoch_002.pt"
    if case == "damaged":
        second.write_bytes(first.read_bytes()[:1000])
        return f"checkpoint {second} cannot be loaded"
    ckpt = load_checkpoint(first)
    args = {**ckpt.model_args, "embedding_size": 8} if case == "other size" else ckpt.model_args
    model = build_model(ckpt.model_name if case == "other size" else "ecapa_tdnn", **args).state_dict()
    name = ckpt.model_name if case == "other size" else "ecapa_tdnn"
    save_checkpoint(second, Checkpoint(model_name=name, model_args=args, model=model, features=ckpt.features))
    return f"cannot average checkpoints of different models: {first} holds campplus"


@pytest.mark.parametrize("case", ["other size", "damaged"])
def test_average_of_unlike_or_damaged_checkpoints_is_one_error(trained, tmp_path, capsys, case):
    exp = copy_exp(trained, tmp_path)
    shutil.copy(exp / "checkpoints" / "epoch_001.pt", exp / "checkpoints" / "epoch_002.pt")
    message = _average_case(exp, case)
    assert average_main(["--exp-dir", str(exp)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (exp / "checkpoints" / "avg.pt").exists()


def test_average_out_a_folder_is_one_error(trained, tmp_path, capsys):
    exp = copy_exp(trained, tmp_path)
    assert average_main(["--exp-dir", str(exp), "--out", str(tmp_path)]) == 2
    assert f"cannot write checkpoint {tmp_path}: {tmp_path} is a folder" in capsys.readouterr().err


# ---------------------------------------------------------------- inference


@pytest.fixture
def eval_dir(tmp_path):
    return make_data_dir(
        tmp_path / "eval",
        {"a-1": "a", "a-2": "a", "b-1": "b"},
        seconds=0.5,
        trials="a-1 a-2 target\na-1 b-1 nontarget\n",
    )


def test_corrupt_checkpoint_file_is_named_by_extraction(trained, tmp_path, eval_dir, capsys):
    ck = damaged_copy(trained[2] / "checkpoints" / "epoch_001.pt", tmp_path / "c.pt")
    out = tmp_path / "e.npz"
    assert extract_main(["--checkpoint", str(ck), "--data", str(eval_dir), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"checkpoint {ck} is corrupt" in err or f"checkpoint {ck} cannot be loaded" in err
    assert not out.exists()


def test_nan_utterance_is_named_and_no_embeddings_written(trained, tmp_path, eval_dir, capsys):
    write_wav(eval_dir / "wav" / "a-2.wav", np.full(8000, np.nan, np.float32), subtype="FLOAT")
    out = tmp_path / "e.npz"
    assert extract_main(["--checkpoint", str(trained[2]), "--data", str(eval_dir), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "1 input(s) gave a non-finite embedding" in err and f"{eval_dir / 'wav.scp'}:2: a-2" in err
    assert not out.exists()


def test_exp_dir_without_checkpoints_is_named(tmp_path, eval_dir, capsys):
    (tmp_path / "empty").mkdir()
    assert (
        extract_main(
            ["--checkpoint", str(tmp_path / "empty"), "--data", str(eval_dir), "--out", str(tmp_path / "e.npz")]
        )
        == 2
    )
    assert f"no checkpoint under {tmp_path / 'empty'}" in capsys.readouterr().err


def test_state_dict_given_as_checkpoint_says_how_to_load_it(tmp_path, eval_dir, capsys):
    torch.save(build_model("campplus", **TINY).state_dict(), tmp_path / "sd.pt")
    assert (
        extract_main(
            ["--checkpoint", str(tmp_path / "sd.pt"), "--data", str(eval_dir), "--out", str(tmp_path / "e.npz")]
        )
        == 2
    )
    assert "not a speakerlab checkpoint" in capsys.readouterr().err


def test_verify_of_a_nan_file_is_an_error(trained, tmp_path, capsys):
    ok = write_wav(tmp_path / "ok.wav", 0.1 * np.random.default_rng(0).standard_normal(8000))
    bad = write_wav(tmp_path / "bad.wav", np.full(8000, np.nan, np.float32), subtype="FLOAT")
    assert run_verify([str(ok), str(bad), "--checkpoint", str(trained[2])]) == 2
    captured = capsys.readouterr()
    assert str(bad) in captured.err and "non-finite embedding" in captured.err and captured.out == ""


def test_verify_with_an_unreadable_file_names_it(trained, tmp_path, capsys):
    wav = tmp_path / "broken.wav"
    wav.write_bytes(b"RIFF0000WAVEjunk")
    assert run_verify([str(wav), str(wav), "--checkpoint", str(trained[2])]) == 2
    assert f"{wav}: cannot read audio" in capsys.readouterr().err


# ---------------------------------------------------------------- features stage


def test_prepare_names_a_stereo_file(tmp_path, capsys):
    root = make_data_dir(tmp_path / "d", {"a-1": "a", "b-1": "b"}, seconds=0.25)
    write_wav(root / "wav" / "b-1.wav", np.zeros((4000, 2)))
    assert prepare_main(["--data", str(root)]) == 2
    assert f"{root / 'wav.scp'}:2:" in capsys.readouterr().err and not (root / "utt2num_samples").exists()


# ---------------------------------------------------------------- recipes


def run_recipe(recipe: str, args, cwd, **env) -> subprocess.CompletedProcess:
    """`bash egs/RECIPE/run.sh ARGS` from the folder `cwd`, with `env` added to the environment."""
    return subprocess.run(
        ["bash", str(ROOT / "egs" / recipe / "run.sh"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
        cwd=cwd,
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--stage", "x"], f"--stage must be a stage number from 1 to {LAST_STAGE}, got 'x'"),
        (
            ["--stop_stage", str(LAST_STAGE + 1)],
            f"--stop_stage must be a stage number from 1 to {LAST_STAGE}, got '{LAST_STAGE + 1}'",
        ),
        (["--stage", "5", "--stop_stage", "4"], "--stage 5 is after --stop_stage 4"),
        (["--stag", "3"], "unknown option --stag"),
        (["--http_proxy", "x"], "unknown option --http_proxy"),
        (["--stage"], "option --stage needs a value"),
        # A word that is no option was once left unread and every stage ran: `-stage 3`, a second value
        (["-stage", "3"], "unexpected argument '-stage': recipe options are --name value or --name=value"),
        (["--stage", "2", "3"], "unexpected argument '3'"),
        (["--launcher", "srun"], "--launcher must be one of auto, local, slurm, got 'srun'"),  # declared choices
    ],
)
@pytest.mark.parametrize("recipe", ["mini", "3dspeaker", "voxceleb", "cnceleb", "custom"])
def test_recipe_option_errors(recipe, args, message, tmp_path):
    r = run_recipe(recipe, args, tmp_path, http_proxy="http://proxy.invalid:3128")
    assert r.returncode == 2 and message in r.stderr and r.stdout == ""


@pytest.mark.parametrize(
    "recipe, args, message",
    [
        ("mini_diar", ["--segmenter", "maybe"], "--segmenter must be one of true, false, got 'maybe'"),
        ("mini_diar", ["--vad", "webrtc"], "--vad must be one of silero, energy, got 'webrtc'"),
        ("voxconverse", ["--vad", "webrtc"], "--vad must be one of silero, energy, got 'webrtc'"),
        ("voxconverse", ["--max_speakers", "0"], "--max_speakers must be a whole number >= 1, got '0'"),
        ("ami", ["--max_speakers", "x"], "--max_speakers must be a whole number >= 1, got 'x'"),
        # A boolean's typo once meant false without a word (`[ "$x" = true ]`)
        ("mini", ["--augment", "yes"], "--augment must be one of true, false, got 'yes'"),
        ("custom", ["--scale", "flase"], "--scale must be one of true, false, got 'flase'"),
        # --jobs 0 reached speakerlab-prepare's thread pool: a ValueError traceback at stage 2
        ("voxceleb", ["--jobs", "0"], "--jobs must be a whole number >= 1, got '0'"),
        ("mini", ["--jobs", "x"], "--jobs must be a whole number >= 1, got 'x'"),
    ],
)
def test_recipe_choices_are_checked_before_any_stage(recipe, args, message, tmp_path):
    r = run_recipe(recipe, args, tmp_path)
    assert r.returncode == 2 and r.stderr == f"error: {message}\n" and not list(tmp_path.iterdir())


@pytest.mark.parametrize("recipe", ["3dspeaker", "voxceleb", "mini_ssl"])
@pytest.mark.parametrize(
    "option, message",
    [
        (["--rounds", "0"], "error: --rounds must be a whole number >= 1, got '0'"),  # ran no round, said "done"
        (["--clusters", "abc"], "error: --clusters must be a whole number >= 2 or 'estimate', got 'abc'"),
        (["--drop", "1.0"], "error: --drop must be a share in [0, 1) like 0.2, got '1.0'"),
    ],
)
def test_pseudo_label_options_are_checked_before_any_stage(recipe, option, message, tmp_path):
    """Found before stage 3 trains or a round embeds the training set (they once failed after both)."""
    labels = [] if recipe == "mini_ssl" else ["--labels", "false"]  # mini_ssl has no labels to turn off
    r = run_recipe(recipe, ["--stage", "3", "--stop_stage", "10", *labels, *option], tmp_path)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1] == message, r.stderr[-2000:]
    assert r.stdout == "" and not list(tmp_path.iterdir())


@pytest.mark.parametrize("recipe", ["3dspeaker", "voxceleb"])
def test_pseudo_label_rounds_need_a_run_without_labels(recipe, tmp_path):
    r = run_recipe(recipe, ["--stage", "10", "--stop_stage", "10"], tmp_path)
    assert (
        r.returncode == 2
        and "error: stage 10 (pseudo-label rounds) follows a self-supervised --labels false run" in r.stderr
    )


def test_a_rerun_round_never_rewrites_the_labels_its_model_was_trained_on(tmp_path):
    """pseudo_label_rounds (egs/tools/common.sh) with stub commands: `speakerlab-pseudo-label` writes the labels of
    $LABEL, `speakerlab-train` leaves a checkpoint. A rerun with the same clusters trains on as before; with other
    clusters (another --clusters or --drop) it once replaced the trained round's labels and then stopped on 'trained on
    another speaker list': now the labels stay and the error names them."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stubs = {
        "speakerlab-extract": "",
        "speakerlab-prepare": "",
        "speakerlab-pseudo-label": 'while [ "$1" != --out ]; do shift; done; out=$2; mkdir -p "$out"; '
        'echo "u1 $LABEL" > "$out/utt2spk"',
        "speakerlab-train": 'while [ "$1" != --exp-dir ]; do shift; done; mkdir -p "$2/checkpoints"; '
        'touch "$2/checkpoints/epoch_001.pt"; echo TRAINED',
    }
    for name, body in stubs.items():
        (bin_dir / name).write_text(f"#!/usr/bin/env bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    script = f'. {ROOT}/egs/tools/common.sh; launch() {{ "$@"; }}; hardware=cpu; pseudo_label_rounds 1 exp/ssl data/u c'
    labels = tmp_path / "data" / "u_ssl_pl1" / "utt2spk"

    def rounds(label):
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "LABEL": label}
        return subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)

    assert rounds("pl0").returncode == 0 and labels.read_text() == "u1 pl0\n"
    r = rounds("pl0")
    assert r.returncode == 0 and "TRAINED" in r.stdout and labels.read_text() == "u1 pl0\n"
    r = rounds("pl1")
    assert r.returncode == 2 and "TRAINED" not in r.stdout and labels.read_text() == "u1 pl0\n"
    assert r.stderr.splitlines()[-1].startswith("error: data/u_ssl_pl1/utt2spk: exp/ssl_pl1 was trained on these")
    assert sorted(p.name for p in labels.parent.parent.iterdir()) == ["u_ssl_pl1"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--init", "x"], "error: stage 1 needs --root DIR (one folder per speaker) or --csv FILE"),
        (["--root", "a", "--csv", "b"], "error: give one of --root and --csv"),
        (["--stage", "3", "--3dspeaker", "campplus"], "error: --3dspeaker campplus needs --weights FILE"),
        (["--stage", "3", "--weights", "w.bin"], "error: --weights goes with --3dspeaker NAME"),
        (
            ["--stage", "3", "--init", "x", "--3dspeaker=campplus", "--weights", "w.bin"],
            "error: give one pretrained model: --init or --3dspeaker NAME --weights FILE",
        ),
    ],
)
def test_custom_recipe_source_errors(args, message, tmp_path):
    r = run_recipe("custom", args, tmp_path)
    assert r.returncode == 2 and message in r.stderr and r.stdout == ""
