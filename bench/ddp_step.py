"""CPU time of a training step on 2 gloo ranks, per classifier head, for one checkout of the code.

    python bench/ddp_step.py                          # this checkout
    python bench/ddp_step.py --code /tmp/base         # another one (e.g. `git archive <commit> | tar -x -C /tmp/base`)
    python bench/ddp_step.py --steps 40 --heads plain sharded --markdown

Each head trains one epoch of `--steps` steps of a small CAM++ (the tests' tiny one) on synthetic noise waves under
`torchrun --nproc_per_node=2` (gloo, OMP_NUM_THREADS=1 per rank), logging every 1000 steps; every `train_step`
call is timed on rank 0, the first 3 (warm-up) left out. Prints the command, the machine, the code's commit and the
median and quartiles of the step seconds per head. The before/after comparison of bench/RESULTS.md runs both
checkouts in one sitting, alternating, on the same machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = """model:
  name: campplus
  args: {embedding_size: 32, growth_rate: 8, bn_size: 2, init_channels: 16, m_channels: 8, num_layers: [1, 1, 1]}
"""
HEADS = {"plain": "{margin: 0.2}", "sharded": "{margin: 0.2, shard_classes: true, sample_rate: 0.5}"}
PER_RANK, SPEAKERS = 4, 16


def make_data(root: Path, steps: int) -> Path:
    """A data dir of `steps` global batches of 1 s noise waves, SPEAKERS speakers."""
    import numpy as np
    import soundfile

    rng = np.random.default_rng(0)
    utts = steps * 2 * PER_RANK
    (root / "wav").mkdir(parents=True, exist_ok=True)
    scp, u2s = [], []
    for i in range(utts):
        utt, spk = f"s{i % SPEAKERS:02d}-{i:05d}", f"s{i % SPEAKERS:02d}"
        path = root / "wav" / f"{utt}.wav"
        soundfile.write(path, (0.1 * rng.standard_normal(16000)).astype("float32"), 16000, subtype="PCM_16")
        scp.append(f"{utt} {path}\n")
        u2s.append(f"{utt} {spk}\n")
    (root / "wav.scp").write_text("".join(sorted(scp)))
    (root / "utt2spk").write_text("".join(sorted(u2s)))
    return root


def worker(out: str, *train_args: str) -> None:
    """Under torchrun: the training command with each train_step timed; rank 0 writes `out`."""
    import speakerlab
    import speakerlab.train.loop as loop

    step, seconds = loop.train_step, []

    def timed(run, batches):
        t0 = time.perf_counter()
        result = step(run, batches)
        seconds.append(time.perf_counter() - t0)
        return result

    loop.train_step = timed
    code = loop.run(list(train_args))
    if os.environ.get("RANK") == "0":
        Path(out).write_text(json.dumps({"code": code, "seconds": seconds, "package": speakerlab.__file__}))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as tests/sharded_ranks.py: without the interpreter's teardown of gloo's threads


def commit_of(code: Path) -> str:
    r = subprocess.run(["git", "-C", str(code), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip() or f"{code} (no git)"


def time_head(code: Path, head: str, data: Path, work: Path, steps: int, port: int) -> dict:
    cfg = work / f"{head}.yaml"
    cfg.write_text(
        MODEL
        + f"""data: {{train: {data}, crop_seconds: 1.0}}
features: {{dither: 0.0}}
loss: {HEADS[head]}
optim: {{lr: 0.05, warmup_epochs: 0.5}}
train: {{epochs: 1, global_batch_size: {2 * PER_RANK}, log_every_steps: 1000}}
hardware: {{device: cpu, precision: fp32, per_device_batch: {PER_RANK}, num_workers: 0, pin_memory: false}}
"""
    )
    out, exp = work / f"{head}.json", work / f"exp_{head}_{time.time_ns()}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(code)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}"]
    cmd += [__file__, "--worker", str(out), "--config", str(cfg), "--exp-dir", str(exp)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{head} on {code} failed:\n{r.stderr[-3000:]}")
    report = json.loads(out.read_text())
    assert report["package"].startswith(str(code)), report["package"]  # the checkout asked for, not this one
    timed = report["seconds"][3:]
    q = statistics.quantiles(timed, n=4)
    return {"head": head, "median_s": statistics.median(timed), "q1_s": q[0], "q3_s": q[2], "steps": len(timed)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--code", default=str(ROOT), help="the checkout to time (default: this one)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--heads", nargs="+", default=list(HEADS), choices=list(HEADS))
    ap.add_argument("--port", type=int, default=29653)
    ap.add_argument("--markdown", action="store_true", help="bench/RESULTS.md rows")
    args = ap.parse_args(argv)
    code = Path(args.code).resolve()
    print(f"command: python bench/ddp_step.py {shlex.join(argv if argv is not None else sys.argv[1:])}")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; code {commit_of(code)}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = make_data(work / "train", args.steps)
        for head in args.heads:
            row = time_head(code, head, data, work, args.steps, args.port)
            if args.markdown:
                print(
                    f"| {head} | {commit_of(code)} | {row['median_s'] * 1000:.0f} ms "
                    f"({row['q1_s'] * 1000:.0f}-{row['q3_s'] * 1000:.0f}) | {row['steps']} |"
                )
            else:
                print(json.dumps(row))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(*sys.argv[2:])
    else:
        main()
