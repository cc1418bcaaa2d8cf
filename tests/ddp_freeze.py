"""`torchrun --nproc_per_node=2 tests/ddp_freeze.py CONFIG EXP_DIR REPORT`: train CONFIG like speakerlab-train
(speakerlab.train.loop.fit), and after every optimizer step compare the ranks' weights and note the wrapper and
the LRs. Rank 0 writes REPORT (JSON), one entry per step:

    rank_gap     the largest weight difference between the ranks (0: DDP reduced every gradient that was used)
    rewrapped    whether run.net is another DDP wrapper than at the step before
    moved        the parameters the step changed (rank 0)
    lr           parameter name -> its group's LR at the step

tests/test_freeze.py runs it; nothing in speakerlab knows of it.
"""

import gc
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from speakerlab.train.build import build_run, load_train_config
from tests.helpers import fit_watched


def main(config: str, exp: str, report: str) -> None:
    cfg, init = load_train_config([config], [], None)
    run = build_run(cfg, Path(exp), init)
    named = list(run.raw.named_parameters())
    steps, state = [], {"net": run.net, "nets": [run.net]}  # every wrapper kept alive: `is` compares them

    def pre(opt, args, kwargs):
        state["before"] = [p.detach().clone() for _, p in named]

    def post(opt, args, kwargs):
        flat = torch.cat([p.detach().flatten() for _, p in named])
        gathered = [torch.empty_like(flat) for _ in range(run.info.world_size)]
        dist.all_gather(gathered, flat)
        lr = {n: g["lr"] for g in opt.param_groups for p in g["params"] for n, q in named if q is p}
        steps.append(
            {
                "rank_gap": max((g - flat).abs().max().item() for g in gathered),
                "rewrapped": run.net is not state["net"],
                "moved": [n for (n, p), b in zip(named, state["before"]) if not torch.equal(p, b)],
                "lr": lr,
            }
        )
        state["net"] = run.net
        state["nets"].append(run.net)

    fit_watched(run, pre, post)
    if run.info.is_main:
        Path(report).write_text(json.dumps(steps))
    # The old DDP wrappers (their reducers hold the process group) go before the group does, both ranks past the
    # last collective first: once, under load, rank 1 aborted at exit after training ("terminate called without an
    # active exception") with them still alive.
    dist.barrier()
    state.clear()
    run.net = None
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
