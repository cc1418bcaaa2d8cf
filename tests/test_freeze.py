"""The freeze schedule (`train.freeze`, speakerlab.train.optim.freeze): which parts of the network take gradients at
each step, the same whichever order the rules are listed in and whether the run was resumed; its config rules;
the retired keys train.freeze_epochs / train.freeze_encoder_steps."""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from speakerlab.checkpoint import Checkpoint, save_checkpoint
from speakerlab.config import FREEZE_PARTS, ConfigError, FeatureSettings, FreezeRule, OptimSettings, load_config
from speakerlab.frontends import feature_spec
from speakerlab.models import build_model
from speakerlab.train.build import build_run, load_train_config
from speakerlab.train.optim.freeze import PARTS, check_freeze, frozen_parts, rule_end
from speakerlab.train.optim.groups import parameter_groups
from speakerlab.train.state.resume import schedule_changes
from tests.helpers import ROOT, TINY_ENCODERS, assert_no_traceback, fit_watched, free_port, losses, voice_data_dir

TRUNK = FreezeRule(modules=["trunk"], until_epoch=1)


def encoder_until(step) -> FreezeRule:
    return FreezeRule(modules=["encoder"], until_step=step)


@pytest.mark.parametrize("encoder_end", [1, 3])
def test_frozen_parts_are_the_union_of_the_rules_that_hold(encoder_end):
    """Trunk for epoch 1 (2 steps), the encoder until a step before / after that: at every step the same parts
    in every listing order (the trunk holds the encoder)."""
    rules = [TRUNK, encoder_until(encoder_end), FreezeRule(modules=["encoder"], until_step=0)]
    expected = [
        frozenset({"trunk", "encoder"} if step < min(2, encoder_end) else {"trunk"} if step < 2 else set())
        | ({"encoder"} if step < encoder_end else set())
        for step in range(6)
    ]
    for order in itertools.permutations(rules):
        assert [frozen_parts(order, step, steps_per_epoch=2) for step in range(6)] == expected
    assert set(PARTS) == set(FREEZE_PARTS)  # every part the config takes has its parameters
    assert rule_end(FreezeRule(modules=["encoder"], until_epoch="end"), 2) == math.inf
    assert frozen_parts([FreezeRule(modules=["encoder"], until_epoch="end")], 10**9, 2) == {"encoder"}


def test_an_old_checkpoint_resumes_under_the_new_key():
    """A checkpoint's config written with train.freeze_epochs / train.freeze_encoder_steps is read as
    train.freeze: the same freeze in any order resumes, another one is named."""
    stored = {"train": {"epochs": 2, "freeze_epochs": 1, "freeze_encoder_steps": 5}}
    rules = [{"modules": ["encoder"], "until_epoch": None, "until_step": 5}, {"modules": ["trunk"], "until_epoch": 1}]
    assert schedule_changes(stored, {"train": {"epochs": 2, "freeze": rules}}) == []
    assert schedule_changes({"train": {"freeze_epochs": 0, "freeze_encoder_steps": 0}}, {"train": {"freeze": []}}) == []
    (change,) = schedule_changes(stored, {"train": {"epochs": 2, "freeze": rules[1:]}})
    assert change.startswith("train.freeze: [{'modules': ['trunk'], 'until_epoch': 1}, {'modules': ['encoder'], ")
    assert change.endswith(" in the checkpoint -> [{'modules': ['trunk'], 'until_epoch': 1}] now")


RAW = {"data": {"train": "x"}, "model": {"name": "campplus"}, "train": {"epochs": 2, "init": "x.pt"}}


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "train.freeze_epochs=1",
            "config key 'train.freeze_epochs' was replaced by 'train.freeze': freeze_epochs: 1 is written "
            "freeze: [{modules: [trunk], until_epoch: 1}]",
        ),
        (
            "train.freeze_encoder_steps=-1",
            "config key 'train.freeze_encoder_steps' was replaced by 'train.freeze': freeze_encoder_steps: -1 is "
            "written freeze: [{modules: [encoder], until_epoch: end}]",
        ),
        ("train.freeze_encoder_steps=20", "is written freeze: [{modules: [encoder], until_step: 20}]"),
        ("train.freeze_epochs=0", "freeze_epochs: 0 is written freeze: []"),
        (
            "train.freeze=[{modules: [trunk]}]",
            "config key 'train.freeze[0].until_epoch' or 'train.freeze[0].until_step'",
        ),
        ("train.freeze=[{modules: [trunk], until_epoch: 1, until_step: 1}]", "give one bound (not both)"),
        ("train.freeze=[{until_step: 1}]", "config key 'train.freeze[0].modules' is required: parts among trunk,"),
        ("train.freeze=[{modules: [head], until_step: 1}]", "config key 'train.freeze[0].modules' must list distinct"),
        ("train.freeze=[{modules: [trunk], until_step: -1}]", "config key 'train.freeze[0].until_step' must be >= 0"),
        ("train.freeze=[{modules: [trunk], until_epoch: -1}]", "config key 'train.freeze[0].until_epoch' must be an"),
        (
            "train.freeze=[{modules: [trunk], until_epoch: 1}, {modules: [trunk], until_epoch: 3}]",
            "config key 'train.freeze[1].until_epoch' (3) must be <= train.epochs (2); the whole run: end",
        ),
        (
            "train.init=null train.freeze=[{modules: [encoder], until_epoch: 1}, {modules: [trunk], until_epoch: 1}]",
            "config key 'train.freeze[1].modules' (trunk): trunk needs train.init (the pretrained model to keep fixed)",
        ),
    ],
)
def test_freeze_settings_are_checked_naming_the_key(override, message):
    overrides = override.split(" train.freeze") if override.startswith("train.init") else [override]
    overrides[1:] = ["train.freeze" + o for o in overrides[1:]]
    with pytest.raises(ConfigError) as e:
        load_config(raw=RAW, overrides=overrides)
    assert message in str(e.value)
    assert load_config(raw=RAW, overrides=["train.freeze=[{modules: [trunk], until_epoch: end}]"]).train.freeze == [
        FreezeRule(modules=["trunk"], until_epoch="end")
    ]


def test_an_encoder_rule_needs_an_encoder_and_steps_within_the_run():
    model = build_model("campplus", embedding_size=16, m_channels=8, num_layers=[1, 1, 1])
    with pytest.raises(ConfigError, match=r"'train.freeze\[1\].modules': model campplus has no self-supervised"):
        check_freeze([TRUNK, encoder_until(2)], model, 10, "campplus")
    with pytest.raises(ConfigError, match=r"'train.freeze\[0\].until_step' \(11\) is beyond the run's 10 steps"):
        check_freeze([FreezeRule(modules=["trunk"], until_step=11)], model, 10, "campplus")
    check_freeze([FreezeRule(modules=["trunk"], until_step=10)], model, 10, "campplus")


# ---------------------------------------------------------------- training a tiny SSL model


@pytest.fixture(scope="module")
def ssl_source(tmp_path_factory):
    """(data dir, checkpoint): a tiny random wav2vec 2.0 + MHFA saved as a speakerlab checkpoint (the
    pretrained model a trunk rule keeps fixed), and 4 speakers x 4 harmonic voices."""
    root = tmp_path_factory.mktemp("ssl")
    args = {"encoder": TINY_ENCODERS["wav2vec2"], "heads": 2, "compression_dim": 8, "embedding_size": 16}
    torch.manual_seed(0)
    model = build_model("ssl_mhfa", **args)
    ckpt = Checkpoint(
        model_name="ssl_mhfa",
        model_args=model.standalone_args(),
        model=model.state_dict(),
        features=feature_spec(FeatureSettings(kind="waveform"), 16000),
    )
    save_checkpoint(root / "pretrained.pt", ckpt)
    return voice_data_dir(root / "train", speakers=4, utts=4), root / "pretrained.pt"


def test_the_optimizer_holds_a_frozen_encoder():
    """parameter_groups takes the encoder's weights whether frozen now or not (they train once released)."""
    model = build_model("ssl_mhfa", encoder=TINY_ENCODERS["wav2vec2"], heads=2, compression_dim=8, embedding_size=16)
    model.set_encoder_frozen(True)
    held = {id(p) for g in parameter_groups(model, torch.nn.Linear(16, 4), OptimSettings()) for p in g["params"]}
    assert all(not p.requires_grad and id(p) in held for p in model.encoder_parameters())
    assert {id(p) for p in model.backend.parameters()} <= held


def finetune_config(tmp_path, source, rules, optim, per_device=8) -> str:
    """Fine-tune the tiny SSL source: 2 steps an epoch (global batch 8), 2 epochs, `rules` as train.freeze."""
    train, pretrained = source
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "ft.yaml"
    path.write_text(
        f"""
features: {{kind: waveform}}
data: {{train: {train}, crop_seconds: 0.5}}
optim: {json.dumps({"lr": 0.01, "min_lr": 0.001, "warmup_epochs": 0, "weight_decay": 0.1, **optim})}
train: {{epochs: 2, global_batch_size: 8, log_every_steps: 1, save_every_steps: 0, init: {pretrained},
         freeze: {json.dumps([{k: v for k, v in vars(r).items() if v is not None} for r in rules])}}}
hardware: {{device: cpu, precision: fp32, per_device_batch: {per_device}, num_workers: 0, pin_memory: false}}
"""
    )
    return str(path)


def trace(config: str, exp, max_steps=None) -> tuple:
    """Train (or resume) through speakerlab.train.loop.fit: (the parameter names, step -> (parameters with a
    gradient at the update, those of them not ~0, parameters the update moved, whether any layer of the back-end
    / of the encoder was in train mode))."""
    cfg, init = load_train_config([config], [], None)
    run = build_run(cfg, exp, init)
    named = list(run.raw.named_parameters())
    record, before = {}, {}
    parts = ("backend", "encoder")

    def pre(opt, args, kwargs):
        before.update({n: p.detach().clone() for n, p in named})
        before["grad"] = frozenset(n for n, p in named if p.grad is not None)
        # A gradient that moves its parameter (compress_k.bias's is rounding noise: a softmax over keys ignores it)
        before["nonzero"] = frozenset(n for n, p in named if p.grad is not None and p.grad.abs().max() > 1e-6)

    def post(opt, args, kwargs):
        moved = frozenset(n for n, p in named if not torch.equal(p, before[n]))
        model = run.raw.model
        leaves = {part: [m for m in getattr(model, part).modules() if not list(m.children())] for part in parts}
        modes = {part: any(m.training for m in leaves[part]) for part in parts}  # dropout, norms
        record[run.state.step] = (before["grad"], before["nonzero"], moved, modes)

    fit_watched(run, pre, post, max_steps)
    return [n for n, _ in named], record


def expected(names, step: int, encoder_end: int) -> tuple:
    """The trunk frozen for epoch 1 (steps 0-1), the encoder until `encoder_end`: the parameters that train
    at `step` (the classifier always; masked_spec_embed never) and which parts are in train mode."""
    trunk, encoder = step >= 2, step >= max(2, encoder_end)
    train = {n for n in names if n.startswith("classifier.")}
    train |= {n for n in names if n.startswith("model.backend.")} if trunk else set()
    train |= {n for n in names if n.startswith("model.encoder.") and "masked_spec_embed" not in n} if encoder else set()
    return frozenset(train), {"backend": trunk, "encoder": encoder}


# MHFA's biases added before a softmax over frames: their gradient is 0 up to rounding, so they may not move.
SOFTMAX_BIASES = {"model.backend.compress_k.bias", "model.backend.attention.bias"}


@pytest.mark.parametrize("encoder_end, optim", [(1, {"name": "sgd", "momentum": 0.9}), (3, {"name": "adamw"})])
def test_each_step_trains_exactly_the_released_parts_in_any_order_and_resumed(ssl_source, tmp_path, encoder_end, optim):
    """The trunk frozen until epoch 1, the encoder until a step before (1) / after (3) that, with weight decay
    (and SGD momentum): at every step exactly the released parameters get a gradient and move, their modules
    in train mode; the same with the rules listed the other way round and stopped / resumed at steps 1 and 2."""
    rules = [TRUNK, encoder_until(encoder_end)]
    names, a = trace(finetune_config(tmp_path / "a", ssl_source, rules, optim), tmp_path / "a" / "exp")
    config = finetune_config(tmp_path / "b", ssl_source, rules[::-1], optim)
    b = {}
    for max_steps in (1, 1, None):  # resumed at step 1 (trunk frozen) and at step 2 (trunk released)
        b.update(trace(config, tmp_path / "b" / "exp", max_steps)[1])
    assert sorted(a) == sorted(b) == [0, 1, 2, 3]
    for step in range(4):
        train, modes = expected(names, step, encoder_end)
        for record in (a, b):
            grads, nonzero, moved, seen_modes = record[step]
            assert grads == train, step
            assert nonzero <= moved <= train, step  # weight decay and momentum move no frozen parameter
            assert train - moved <= SOFTMAX_BIASES, step
            assert seen_modes == modes, step
    # The rules' order and the two resumes change nothing: the same loss at every step.
    la, lb = losses(tmp_path / "a" / "exp"), losses(tmp_path / "b" / "exp")
    assert sorted(la) == sorted(lb) == [1, 2, 3, 4]
    for step in (1, 2, 3, 4):
        assert lb[step] == pytest.approx(la[step], rel=1e-6, abs=1e-7), step


@pytest.mark.slow
def test_under_ddp_each_change_wraps_again_and_the_lr_scales_hold(ssl_source, tmp_path):
    """Two processes (gloo, tests/ddp_freeze.py): the trunk frozen until epoch 1, the encoder until step 3, the
    trunk at 0.25x the classifier's LR and the encoder at a further 0.5x. DDP is wrapped again exactly when the
    trainable set changes (steps 0, 2, 3), the ranks' weights stay equal at every step (each gradient that was
    used was reduced: a released part not registered with DDP would drift apart on the two ranks), only the
    released parts move, and every group keeps its LR scale."""
    optim = {"name": "adamw", "backbone_lr_scale": 0.25, "encoder_lr_scale": 0.5}
    config = finetune_config(tmp_path, ssl_source, [TRUNK, encoder_until(3)], optim, per_device=4)
    report = tmp_path / "report.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}"]
    cmd += [str(ROOT / "tests" / "ddp_freeze.py"), config, str(tmp_path / "exp"), str(report)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    log = (tmp_path / "exp" / "train.log").read_text()
    assert_no_traceback(r.stdout, r.stderr, log)
    assert "global 8 = 2 device(s) x 4 x accum 1" in log
    steps = json.loads(report.read_text())
    assert [s["rewrapped"] for s in steps] == [True, False, True, True]
    names = list(steps[0]["lr"])
    for step, s in enumerate(steps):
        assert s["rank_gap"] < 1e-6, (step, s["rank_gap"])
        train, _ = expected(names, step, 3)
        assert train - SOFTMAX_BIASES <= set(s["moved"]) <= train, step
        head = s["lr"]["classifier.weight"]
        for name, lr in s["lr"].items():
            scale = 1.0 if name.startswith("classifier.") else 0.25 * (0.5 if name.startswith("model.encoder.") else 1)
            assert lr == pytest.approx(scale * head, rel=1e-9), (step, name)
