"""torchrun's elastic agent as the recipes start it (`launch` in egs/tools/common.sh):

    python -m speakerlab.train.agent <torchrun options> --no-python speakerlab-train ...

It is torchrun itself (torch.distributed.run, its options and its restarts) with two differences:

- SIGUSR1, Slurm's `--signal=USR1@...` ahead of a time limit, is handled like SIGTERM: the agent passes
  it to every worker (which finish their step, checkpoint and exit, speakerlab.train.preemption) and
  waits for them up to TORCH_ELASTIC_SHUTDOWN_TIMEOUT (set to SHUTDOWN_S here unless you set it)
  instead of dying at once and leaving them to a SIGKILL;
- its exit code: the one its failed workers exited with (2 bad input, 3 training stopped, 4 a stalled
  rank, 75 pre-empted; those torchrun itself then ended count for nothing), in one line instead of 1
  and a traceback; 1 when they differ or a signal killed them; 75 when the agent itself was signalled.
  egs/tools requeues a Slurm job on 75.
"""

from __future__ import annotations

import os
import signal
import sys

from speakerlab.train.cluster import EXIT_PREEMPTED

SHUTDOWN_S = 300  # seconds the workers get to write a checkpoint once signalled, before SIGKILL


def launch(argv=None) -> int:
    """torchrun's command line (its options, its --help) -> the exit code described above."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    os.environ.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(SHUTDOWN_S))

    def forward(signum, frame):  # the agent's own SIGTERM handling: stop the workers with this signal
        raise SignalException(f"agent {os.getpid()} got {signal.Signals(signum).name}", signal.Signals(signum))

    before = signal.signal(signal.SIGUSR1, forward)
    try:
        torchrun(argv)
    except SignalException as e:
        print(f"agent: {e.sigval.name}: the workers were asked to checkpoint and stop", file=sys.stderr, flush=True)
        return EXIT_PREEMPTED
    except ChildFailedError as e:
        # Once one process fails torchrun ends the others (SIGTERM: -15): the code they exited with is the cause.
        codes = {f.exitcode for f in e.failures.values() if f.exitcode > 0}
        code = codes.pop() if len(codes) == 1 else 1
        shown = ", ".join(f"rank {r}: {f.exitcode}" for r, f in sorted(e.failures.items()))
        print(f"agent: worker exit codes {shown}; exit {code}", file=sys.stderr, flush=True)
        return code
    finally:
        signal.signal(signal.SIGUSR1, before)
    return 0


if __name__ == "__main__":
    sys.exit(launch())
