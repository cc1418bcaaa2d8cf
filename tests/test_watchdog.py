"""The stalled-rank watchdog must not disturb processes forked while it runs (data-loader workers)."""

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "speakerlab"

# A watchdog on a fake store, then a fork-started DataLoader with 2 workers and a bare os.fork: every
# child runs CPython's after-fork clean-up over the live threads, the watchdog's among them.
CHILDREN = textwrap.dedent(
    """
    import os, sys, torch
    from speakerlab.train.launch.watchdog import Watchdog

    class Store:
        def __init__(self): self.kv = {}
        def set(self, k, v): self.kv[k] = v.encode()
        def get(self, k): return self.kv[k]
        def check(self, keys): return all(k in self.kv for k in keys)

    dog = Watchdog(0, 2, 60.0, log=lambda m: None, store=Store(), interval_s=0.05)
    dog.start()
    loader = torch.utils.data.DataLoader(
        list(range(8)), batch_size=2, num_workers=2, multiprocessing_context="fork"
    )
    assert sum(len(b) for b in loader) == 8
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    dog.stop()
    print("done", flush=True)
    """
)


def test_forked_children_print_no_traceback_while_the_watchdog_runs():
    r = subprocess.run([sys.executable, "-c", CHILDREN], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "done", r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr


# A watchdog on a real TCPStore beating as fast as it can, stopped just before the interpreter exits: the
# thread is inside a store call most of the time. Left running (the old stop()), 3 of 5 such processes
# aborted with "terminate called without an active exception" (-6) on the 2-core machine.
EXIT_DURING_A_STORE_CALL = textwrap.dedent(
    """
    import datetime, time
    import torch.distributed as dist
    from speakerlab.train.launch.watchdog import Watchdog

    store = dist.TCPStore("127.0.0.1", 0, world_size=1, is_master=True, timeout=datetime.timedelta(seconds=30))
    dog = Watchdog(0, 2, 60.0, log=lambda m: None, store=store, interval_s=1e-4)
    dog.start()
    time.sleep(0.3)
    dog.stop()
    assert not dog.thread.is_alive()
    print("done", flush=True)
    """
)


def test_a_process_that_stops_its_watchdog_exits_cleanly_whatever_the_thread_was_doing():
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", EXIT_DURING_A_STORE_CALL], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and out.strip() == "done", (p.returncode, err[-2000:])
        assert "terminate called" not in err, err[-2000:]


def test_no_package_class_subclasses_thread():
    """Threads are owned (composition), never subclassed: a subclass's attribute can shadow a private
    Thread member that CPython calls after fork (the watchdog's `_stop` did)."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                for base in node.bases:
                    name = ast.unparse(base)
                    if name in ("Thread", "threading.Thread", "Process", "multiprocessing.Process"):
                        offenders.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}({name})")
    assert not offenders, offenders
