"""The margin heads sharded over ranks (speakerlab.train.losses.sharded): the same loss and gradients as the full head,
checkpoints that load on another number of ranks, Partial FC sampling, and speaker rows carried over to a new
speaker set. The multi-rank checks run tests/sharded_ranks.py under torchrun (gloo, CPU)."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
import yaml

import speakerlab.train.losses.sharded as sharded
from speakerlab.checkpoint import load_checkpoint
from speakerlab.config import ConfigError, load_config
from speakerlab.train.loop import main as train_main
from speakerlab.train.losses.margin import AAMSoftmax, SphereFace2
from speakerlab.train.losses.sharded import ShardedAAM, ShardedSphereFace2, shard_range
from speakerlab.train.losses.sharded_state import start_rows
from speakerlab.train.state.average import main as average_main
from tests.helpers import ROOT, TINY_MODEL, assert_no_traceback, free_port, losses, make_data_dir

AAM_VARIANT = {"scale": 8.0, "subcenters": 3, "inter_topk": 2, "inter_topk_margin": 0.1, "final_margin": 0.3}


@pytest.mark.parametrize(
    "full_cls,sharded_cls,args",
    [
        (AAMSoftmax, ShardedAAM, {"scale": 8.0}),
        (AAMSoftmax, ShardedAAM, AAM_VARIANT),
        (SphereFace2, ShardedSphereFace2, {"scale": 8.0, "lam": 0.7, "t": 3}),
    ],
    ids=["aam", "aam_subcenter_topk", "sphereface2"],
)
def test_on_one_rank_the_sharded_head_is_the_full_head(full_cls, sharded_cls, args):
    """World 1, float64: loss, embedding and row gradients, and top-1 equal the full head's."""
    torch.manual_seed(0)
    full = full_cls(6, 9, **args).double()
    full.set_margin(0.3)
    head = sharded_cls(6, 9, **args).double()
    head.load_state_dict(full.state_dict())
    head.set_margin(0.3)
    emb = torch.randn(8, 6, dtype=torch.float64)
    labels = torch.tensor([0, 1, 2, 3, 4, 8, 8, 5])
    e1, e2 = emb.clone().requires_grad_(), emb.clone().requires_grad_()
    l1, cos = full(e1, labels)
    l2, top1 = head(e2, labels)
    l1.backward()
    l2.backward()
    assert abs(l1.item() - l2.item()) < 1e-12
    torch.testing.assert_close(e2.grad, e1.grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(head.weight.grad, full.weight.grad, rtol=0, atol=1e-12)
    assert torch.equal(top1, cos.argmax(1))


def test_shards_cover_every_speaker_once():
    for classes in (1, 10, 11, 1000003):
        for world in (1, 2, 3, 7):
            ranges = [shard_range(classes, r, world) for r in range(world)]
            assert ranges[0][0] == 0 and ranges[-1][1] == classes
            assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
            assert max(hi - lo for lo, hi in ranges) - min(hi - lo for lo, hi in ranges) <= 1


def test_rows_start_alike_on_any_number_of_ranks(monkeypatch):
    """The initial rows are the plain head's for the same torch seed, drawn in blocks of rows: 3 ranks hold
    exactly the rows of 1, which are AAMSoftmax's, and torch's generator is left where the plain head leaves it
    (so whatever draws next draws the same)."""
    monkeypatch.setattr(sharded, "INIT_BLOCK", 4)  # several blocks per shard

    def built(make):
        torch.manual_seed(9)
        return make().weight.detach(), torch.rand(3)

    plain, after = built(lambda: AAMSoftmax(5, 13, subcenters=2))
    one, one_after = built(lambda: ShardedAAM(5, 13, seed=9, subcenters=2))
    assert torch.equal(one, plain) and torch.equal(one_after, after) and one.shape == (26, 5)
    parts = []
    for rank in range(3):
        monkeypatch.setattr(sharded, "_world", lambda rank=rank: (rank, 3))
        part, part_after = built(lambda: ShardedAAM(5, 13, seed=9, subcenters=2))
        assert torch.equal(part_after, after)
        parts.append(part)
    torch.testing.assert_close(torch.cat(parts), one, rtol=0, atol=0)


def test_speaker_rows_carry_over_to_a_new_speaker_set(monkeypatch):
    """start_rows: this head's speaker 0 is the source's 2 and 3 is its 0; one source direction seeds all K
    sub-centers; on rank 1 of 2 only the speakers of its shard are written."""
    source = AAMSoftmax(4, 3).state_dict()
    head = AAMSoftmax(4, 4, subcenters=2)
    before = head.weight.detach().clone()
    assert start_rows(head, source, 3, [(0, 2), (3, 0)]) == 2
    w = head.weight.detach()
    for sub in range(2):
        torch.testing.assert_close(w[0 * 2 + sub], source["weight"][2])
        torch.testing.assert_close(w[3 * 2 + sub], source["weight"][0])
    torch.testing.assert_close(w[2:6], before[2:6])  # speakers 1 and 2: new, untouched
    monkeypatch.setattr(sharded, "_world", lambda: (1, 2))
    shard = ShardedAAM(4, 4)  # speakers 2, 3
    kept = shard.weight.detach().clone()
    start_rows(shard, source, 3, [(0, 2), (3, 0)])
    torch.testing.assert_close(shard.weight[1], source["weight"][0])
    torch.testing.assert_close(shard.weight[0], kept[0])


def test_sampled_classes_keep_every_positive():
    head = ShardedAAM(4, 1000, sample_rate=0.01, seed=1)
    labels = torch.tensor([3, 500, 999, 3])
    head.set_step(7)
    cols = head._columns(labels)
    assert {3, 500, 999} <= set(cols.tolist()) and len(cols) < 60
    head.set_step(7)
    assert torch.equal(head._columns(labels), cols)  # a function of (seed, step, micro-batch, rank)
    loss, top1 = head(F.normalize(torch.randn(4, 4)), labels)
    assert torch.isfinite(loss) and top1.shape == (4,)


@pytest.mark.parametrize(
    "override,message",
    [
        (["loss.name=sphereface2", "loss.subcenters=3"], "sub-centers and inter-top-k are aam's"),
        (["loss.sample_rate=0"], "config key 'loss.sample_rate' must be in (0, 1], got 0"),
    ],
)
def test_bad_head_settings_are_one_line(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        load_config(raw={"model": {"name": "campplus"}, "data": {"train": "x"}}, overrides=override)


def torchrun(nproc: int, *args, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", f"--master_port={free_port()}"]
    r = subprocess.run(cmd + [str(a) for a in args], env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-4000:]
    return r


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """tests/sharded_ranks.py's equal, sampled and save modes in one start of 2 gloo ranks: their reports' folder."""
    out = tmp_path_factory.mktemp("two_ranks")
    torchrun(2, ROOT / "tests" / "sharded_ranks.py", "equal,sampled,save", out)
    return out


@pytest.mark.slow
def test_two_gloo_ranks_equal_the_full_head_in_float64(two_ranks):
    """AAM, AAM with sub-centers and inter-top-k, SphereFace2: the sharded head under DDP on 2 ranks gives the
    full head's loss and gradients (rows, the model's after DDP's average, SphereFace2's bias) on the global
    batch, to float64 rounding; Partial FC's loss is the full head's softmax over the sampled classes."""
    report = json.loads((two_ranks / "equal.json").read_text())
    assert report["world"] == 2
    for name in ("aam", "aam_subcenter_topk", "sphereface2"):
        r = report[name]
        assert r["loss"] < 1e-12 and r["rows"] < 1e-12 and r["model"] < 1e-12 and r["bias"] < 1e-12, (name, r)
        assert r["top1"], name
    sampled = json.loads((two_ranks / "sampled.json").read_text())
    assert sampled["loss"] < 1e-12 and sampled["positives_kept"] and sampled["classes"] < 23, sampled


@pytest.mark.slow
def test_a_checkpoint_of_two_ranks_loads_on_three(two_ranks, tmp_path):
    """The head and its momentum gathered in full on 2 ranks; 3 ranks each take their rows of it."""
    assert json.loads((two_ranks / "save.json").read_text())["rows"] == [23, 6]
    shutil.copy(two_ranks / "state.pt", tmp_path / "state.pt")
    torchrun(3, ROOT / "tests" / "sharded_ranks.py", "load", tmp_path)
    loaded = json.loads((tmp_path / "load.json").read_text())
    assert loaded == {"world": 3, "rows": 0.0, "momentum": 0.0, "wrong_shape": False}


@pytest.mark.slow
def test_sharded_training_stopped_on_two_ranks_resumes_on_three(tmp_path):
    """speakerlab-train with loss.shard_classes on 2 processes, stopped after a step, then the same command on 3:
    it resumes at that step and finishes; the checkpoints hold the whole classifier, which averaging and
    train.init read as any (a large-margin stage, unsharded, starts from the average); with model selection every
    rank takes part in writing best.pt (the rows are gathered)."""
    utts = {f"s{s}-{u}": f"s{s}" for s in range(6) for u in range(4)}
    train = make_data_dir(tmp_path / "train", utts, seconds=0.6)
    trials = "".join(f"v{a}-0 v{b}-1 {'target' if a == b else 'nontarget'}\n" for a in range(2) for b in range(2))
    val = make_data_dir(tmp_path / "val", {f"v{s}-{u}": f"v{s}" for s in range(2) for u in range(2)}, 0.6, 1, trials)
    cfg = tmp_path / "sharded.yaml"
    cfg.write_text(
        TINY_MODEL
        + f"""
data: {{train: {train}, val: {val}, crop_seconds: 0.5}}
features: {{dither: 0.0}}
loss: {{margin: 0.2, shard_classes: true, subcenters: 2}}
optim: {{lr: 0.05, warmup_epochs: 0.5}}
train: {{epochs: 2, global_batch_size: 12, log_every_steps: 1, save_every_steps: 1, keep_best: true}}
hardware: {{device: cpu, precision: fp32, num_workers: 0, pin_memory: false}}
"""
    )
    exp = tmp_path / "exp"
    args = ["-m", "speakerlab.train", "--config", cfg, "--exp-dir", exp]
    torchrun(2, *args, "--max-steps", "1", "hardware.per_device_batch=6")
    r = torchrun(3, *args, "hardware.per_device_batch=4")
    log = (exp / "train.log").read_text()
    assert_no_traceback(r.stdout, r.stderr, log)
    assert "global 12 = 3 device(s) x 4 x accum 1" in log and "resumed from" in log
    assert "training done: 2 epochs, 4 steps" in log
    assert sorted(losses(exp)) == [1, 2, 3, 4]
    last = load_checkpoint(exp / "checkpoints" / "epoch_002.pt")
    assert last.classifier["weight"].shape == (12, 32) and len(last.speakers) == 6
    momentum = last.resume.optimizer["state"]
    assert any(v.get("momentum_buffer", torch.zeros(0)).shape == (12, 32) for v in momentum.values())
    assert load_checkpoint(exp / "checkpoints" / "best.pt").classifier["weight"].shape == (12, 32)
    overlay = tmp_path / "lm.yaml"
    overlay.write_text(yaml.safe_dump({"train": {"epochs": 1}, "loss": {"shard_classes": False}}))
    lm = ["--config", str(cfg), "--config", str(overlay), "--exp-dir", str(tmp_path / "lm")]
    assert average_main(["--exp-dir", str(exp), "--last", "2"]) == 0
    assert load_checkpoint(exp / "checkpoints" / "avg.pt").classifier["weight"].shape == (12, 32)
    assert train_main([*lm, f"train.init={exp / 'checkpoints' / 'avg.pt'}", "hardware.per_device_batch=12"]) == 0
    assert "classifier kept (6 speakers, as in the source)" in (tmp_path / "lm" / "train.log").read_text()


def test_on_one_process_a_sharded_run_is_the_plain_run(tiny_corpus, tmp_path):
    """loss.shard_classes on one process, the same seed: the tiny config's whole run (4 steps, at a tenth of its LR)
    has the plain head's losses, step 1 to its last bit (the rows start alike, the generator is left alike; drawn
    from numpy they gave another step-1 loss; the sharded softmax sums in another order: over train.seed 1-5 the
    step-1 losses were bit-equal for four and one float32 unit apart for the fifth, 2026-11-26, Intel Xeon), the
    later steps to float32 rounding: step 1's update differs in the last bits (bit-equal at step 2 on an AMD EPYC,
    1.4e-6 relative on an Intel Xeon), and the chaotic 4-step run grows that (float64 equality is
    test_on_one_rank_the_sharded_head_is_the_full_head's). train.log says the head is sharded, and sampled below
    loss.sample_rate 1."""
    config = str(tiny_corpus[0])
    runs = {"plain": [], "sharded": ["loss.shard_classes=true"], "sampled": ["loss.sample_rate=0.5"]}
    for name, overrides in runs.items():
        assert train_main(["--config", config, "--exp-dir", str(tmp_path / name), "optim.lr=0.005", *overrides]) == 0
    plain, ours = losses(tmp_path / "plain"), losses(tmp_path / "sharded")
    assert sorted(ours) == sorted(plain) == [1, 2, 3, 4]
    assert abs(ours[1] - plain[1]) <= 2.5e-7 * abs(plain[1]), (ours, plain)  # two float32 units at most
    assert abs(ours[2] - plain[2]) <= 1e-5 * abs(plain[2]), (ours, plain)
    assert all(abs(ours[s] - plain[s]) <= 1e-3 * abs(plain[s]) for s in (3, 4)), (ours, plain)
    head = "classifier sharded over 1 process (speakers 0-3 of 4 here)"
    assert f"{head}; every speaker in each step's softmax" in (tmp_path / "sharded" / "train.log").read_text()
    sampled = (tmp_path / "sampled" / "train.log").read_text()
    assert f"{head}; sampled: each other speaker kept with probability 0.5 per micro-batch" in sampled
    assert "classifier sharded" not in (tmp_path / "plain" / "train.log").read_text()
