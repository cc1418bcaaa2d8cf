"""The classifier at 100k and 1M classes on gloo ranks (CPU): peak RSS per rank and time per optimizer step of the
full AAM head (every rank holds all rows, DDP averages their gradient), the head sharded over the ranks
(speakerlab.train.losses.sharded, sample rate 1: the same loss and gradients) and sharded with Partial FC sampling at
rate 0.1.

    python bench/partial_fc.py [--classes 100000 1000000] [--world 2] [--dim 128] [--batch 64] [--steps 3]

Each (classes, head, ranks) runs in a fresh `torch.distributed.run` (peak RSS only grows): a linear layer stands
for the embedding model (80 -> dim), the head is AAM (scale 32, margin 0.2), SGD with momentum, `--batch` rows
per rank, one warm-up step then `--steps` timed ones. Reported per rank: peak RSS (ru_maxrss, GiB), the head's
state (its rows, their gradient and momentum, GiB: what 1/W applies to), and the median step time. The sharded
head on 1 rank is the reference for 1/W. Prints a JSON line per run and a Markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

VARIANTS = {"full": (False, 1.0), "sharded": (True, 1.0), "sharded+rate0.1": (True, 0.1)}


def child(args) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    from speakerlab.train.build import SpeakerNet
    from speakerlab.train.losses.margin import AAMSoftmax
    from speakerlab.train.losses.sharded import ShardedAAM, keep_out_of_ddp

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    sharded, rate = VARIANTS[args.variant]
    classes = args.classes[0]
    model = nn.Linear(80, args.dim)
    head = ShardedAAM(args.dim, classes, sample_rate=rate, seed=0) if sharded else AAMSoftmax(args.dim, classes)
    head.set_margin(0.2)
    net = SpeakerNet(model, head, contextlib.nullcontext)
    keep_out_of_ddp(net)
    ddp = nn.parallel.DistributedDataParallel(net) if world > 1 else net
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(args.batch, 80, generator=g), torch.randint(0, classes, (args.batch,), generator=g)
    times = []
    for step in range(1 + args.steps):
        dist.barrier()
        start = time.perf_counter()
        head.set_step(step)
        loss, _ = ddp(x, y)
        loss.backward()
        net.clip_grad_norm([p for p in net.parameters()], 5.0)
        opt.step()
        opt.zero_grad(set_to_none=False)  # the gradient stays allocated, as in a training loop between steps
        dist.barrier()
        times.append(time.perf_counter() - start)
    head_state = 3 * sum(p.numel() * p.element_size() for p in head.parameters())  # rows, gradient, momentum
    mine = {
        "rank": rank,
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "head_state_gib": head_state / 2**30,
        "step_s": statistics.median(times[1:]),
        "loss": float(loss),
    }
    every = [None] * world
    dist.all_gather_object(every, mine)
    if rank == 0:
        print(json.dumps({"classes": classes, "variant": args.variant, "world": world, "ranks": every}))
    dist.barrier()  # no rank tears gloo's pairs down while another still talks over them (it aborts, rarely)
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--classes", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--batch", type=int, default=64, help="rows per rank")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--variant", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return 0
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    rows = []
    runs = [(c, v, args.world) for c in args.classes for v in VARIANTS] + [(c, "sharded", 1) for c in args.classes]
    for port, (classes, variant, world) in enumerate(runs, 29700):
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={world}", f"--master_port={port}"]
        cmd += [__file__, "--child", f"--variant={variant}", f"--classes={classes}", f"--dim={args.dim}"]
        cmd += [f"--batch={args.batch}", f"--steps={args.steps}"]
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if r.returncode != 0:
            print(r.stderr[-3000:], file=sys.stderr)
            return 1
        out = json.loads(r.stdout.strip().splitlines()[-1])
        print(json.dumps(out), flush=True)
        rows.append(out)
    print(f"# {platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()}, dim {args.dim}, {args.batch}/rank")
    print("| classes | head | ranks | peak RSS per rank GiB | head state per rank GiB | s/step |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        ranks = r["ranks"]
        rss = " / ".join(f"{x['peak_rss_gib']:.2f}" for x in ranks)
        state = " / ".join(f"{x['head_state_gib']:.3f}" for x in ranks)
        step = max(x["step_s"] for x in ranks)
        print(f"| {r['classes']:,} | {r['variant']} | {r['world']} | {rss} | {state} | {step:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
