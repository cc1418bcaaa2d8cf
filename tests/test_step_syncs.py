"""The training step's host syncs and collectives on 2 gloo ranks (tests/step_syncs.py counts them, telling host from
device tensors as a GPU would): with the plain head and with the sharded, sampled head (Partial FC), two
micro-batches a step, validation at the epoch's end."""

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from tests.helpers import ROOT, TINY_MODEL, free_port, make_data_dir

HEADS = {"plain": "{margin: 0.2}", "sharded": "{margin: 0.2, shard_classes: true, sample_rate: 0.5, subcenters: 2}"}


@pytest.fixture(scope="module")
def counted(tmp_path_factory):
    """head -> [the intervals of rank 0, of rank 1] (tests/step_syncs.py's records) of one epoch of 4 steps."""
    root = tmp_path_factory.mktemp("step_syncs")
    train = make_data_dir(root / "train", {f"s{s}-{u}": f"s{s}" for s in range(8) for u in range(4)}, seconds=0.6)
    trials = "".join(f"v{a}-0 v{b}-1 {'target' if a == b else 'nontarget'}\n" for a in range(2) for b in range(2))
    val = make_data_dir(root / "val", {f"v{s}-{u}": f"v{s}" for s in range(2) for u in range(2)}, 0.6, 1, trials)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    out = {}
    for head, loss in HEADS.items():
        cfg = root / f"{head}.yaml"
        cfg.write_text(
            TINY_MODEL
            + f"""
data: {{train: {train}, val: {val}, crop_seconds: 0.5}}
features: {{dither: 0.0}}
loss: {loss}
optim: {{lr: 0.05, warmup_epochs: 0.5}}
train: {{epochs: 1, global_batch_size: 8, log_every_steps: 100}}
hardware: {{device: cpu, precision: fp32, per_device_batch: 2, num_workers: 0, pin_memory: false}}
"""
        )
        (root / head).mkdir()
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}"]
        cmd += [ROOT / "tests" / "step_syncs.py", root / head, "--config", cfg, "--exp-dir", root / f"exp_{head}"]
        r = subprocess.run([str(c) for c in cmd], env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-4000:]
        reports = [json.loads((root / head / f"rank{rank}.json").read_text()) for rank in range(2)]
        assert [rep["code"] for rep in reports] == [0, 0], r.stderr[-4000:]
        out[head] = [rep["intervals"] for rep in reports]
    return out


def per_step(intervals, kind):
    """Counter of `kind` records ("syncs" or "collectives") per non-logging step: {step: Counter}."""
    return {i["step"]: Counter(i[kind]) for i in intervals if not i["logging"]}


# The sharded head's own collectives, its arithmetic over the ranks' classes (as DDP's are its gradients'):
# the rows and labels gathered, the softmax's max, sum and target logit, the top-1, the gradient's sum.
HEAD = ("sharded.py:_gather", "sharded.py:forward", "sharded.py:backward", "sharded.py:_top1", "sharded.py:_threshold")


@pytest.mark.slow
@pytest.mark.parametrize("head", HEADS)
def test_a_step_makes_one_collective_beyond_ddp_and_the_head_and_no_host_sync(counted, head):
    """Every non-logging step, on both ranks: one all-reduce of the step's own (the guard's flags, pre-emption's
    signals, a sharded head's squared norm) and no host read at all (the update is skipped on the device; the
    verdicts and signals are read on logging steps)."""
    for rank, intervals in enumerate(counted[head]):
        syncs, collectives = per_step(intervals, "syncs"), per_step(intervals, "collectives")
        assert len(syncs) == 3, intervals  # 4 steps, the last one logs
        for step in syncs:
            print(head, "rank", rank, "step", step, dict(syncs[step]), dict(collectives[step]))
            own = {k: n for k, n in collectives[step].items() if not k.endswith(HEAD)}
            assert own == {"all_reduce speakerlab/train/step.py:agreed_flags": 1}, (head, rank, step, own)
            assert sum(syncs[step].values()) == 0, (head, rank, step, syncs[step])


@pytest.mark.slow
def test_every_rank_takes_part_in_validation(counted):
    """The epoch's validation: rank 1 embeds its shards through the extraction lifecycle (its barriers there),
    instead of waiting for rank 0 at a barrier of the loop."""
    last = counted["plain"][1][-1]
    assert last["logging"] and "barrier speakerlab/inference/extract.py:run" in last["collectives"], last
