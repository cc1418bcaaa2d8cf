"""torchrun's elastic agent as the recipes start it (`launch` in egs/tools/common.sh):

    python -m speakerlab.train.launch.agent <torchrun options> --no-python speakerlab-train ...

It is torchrun itself (torch.distributed.run, its options and its restarts) with two differences:

- SIGUSR1, Slurm's `--signal=USR1@...` ahead of a time limit, is handled like SIGTERM: the agent passes
  it to every worker (which finish their step, checkpoint and exit, speakerlab.train.launch.preemption) and
  waits for them up to TORCH_ELASTIC_SHUTDOWN_TIMEOUT (set to SHUTDOWN_S here unless you set it)
  instead of dying at once and leaving them to a SIGKILL;
- its exit code: the one its failed workers exited with (2 bad input, 3 training stopped, 4 a stalled
  rank, 75 pre-empted; those torchrun itself then ended count for nothing), in one line instead of 1
  and a traceback; 1 when they differ or a signal killed them; 75 when the agent itself was signalled
  (SIGTERM, SIGUSR1), 130 for Ctrl-C (SIGINT: torchrun passes it on and the workers checkpoint and stop
  as for the others). egs/tools requeues a Slurm job on 75, never on 130.

and one repair: the agent that hosts the rendezvous store leaves after the others (pytorch/pytorch#69520:
torch's exit barrier lets it exit while another node's agent is between its check-in and its wait, which
then logs a traceback after a run that succeeded).
"""

from __future__ import annotations

import os
import signal
import sys
import time

from speakerlab.stopping import exit_code, say
from speakerlab.train.launch.torch_private import TorchPrivateMissing, require

SHUTDOWN_S = 300  # seconds the workers get to write a checkpoint once signalled, before SIGKILL
LEAVE_S = 60.0  # seconds the store's host waits for the other agents to leave the exit barrier
LEFT_KEY = "speakerlab/agents_left"


def listens_on(port: int) -> bool:
    """Whether this process holds a listening TCP socket on `port` (it hosts the store there), from
    Linux's /proc; False where /proc has no answer."""
    inodes = set()
    try:
        for fd in os.listdir("/proc/self/fd"):
            try:
                inodes.add(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:  # listdir's own descriptor, closed by now
                pass
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with open(table) as f:
                for line in f.readlines()[1:]:
                    cols = line.split()  # sl local_address rem_address st ... inode
                    if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                        if f"socket:[{cols[9]}]" in inodes:
                            return True
    except OSError:
        pass
    return False


def leave_in_order(store, agents: int, hosting: bool, timeout_s: float = LEAVE_S) -> None:
    """After torch's exit barrier: every agent checks out (one acknowledged `add`); the one hosting the
    store waits until all `agents` have, so that no agent still talks to a store that is gone."""
    store.add(LEFT_KEY, 1)
    deadline = time.monotonic() + timeout_s
    while hosting and store.add(LEFT_KEY, 0) < agents and time.monotonic() < deadline:
        time.sleep(0.02)


def _keep_the_store_until_all_left() -> None:
    """Wraps torch's exit barrier (SimpleElasticAgent._exit_barrier: private, checked by torch_private.require
    first) in this process with leave_in_order; the store and group size through the agent's public worker group."""
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

    require("exit_barrier")
    torch_barrier = SimpleElasticAgent._exit_barrier

    def exit_barrier(agent):
        torch_barrier(agent)  # logs its own failure (a store already gone) and returns
        group = agent.get_worker_group()
        store = group.store
        tcp = getattr(store, "underlying_store", store)  # the TCP store under torchelastic's prefix store
        try:
            leave_in_order(store, group.group_world_size, listens_on(getattr(tcp, "port", -1)))
        except Exception:  # noqa: BLE001 - the host has gone: nobody is left to wait for
            pass

    SimpleElasticAgent._exit_barrier = exit_barrier


def launch(argv=None) -> int:
    """torchrun's command line (its options, its --help) -> the exit code described above."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    os.environ.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(SHUTDOWN_S))
    try:
        _keep_the_store_until_all_left()
    except TorchPrivateMissing as e:
        print(f"agent: error: {e}", file=sys.stderr, flush=True)
        return 2

    def forward(signum, frame):  # the agent's own SIGTERM handling: stop the workers with this signal
        raise SignalException(f"agent {os.getpid()} got {signal.Signals(signum).name}", signal.Signals(signum))

    before = signal.signal(signal.SIGUSR1, forward)
    try:
        torchrun(argv)
    except SignalException as e:
        say(f"agent: {e.sigval.name}: the workers were asked to checkpoint and stop")
        return exit_code(e.sigval)
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
