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
    from speakerlab.train.watchdog import Watchdog

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
    dog.thread.join(5)
    print("done", flush=True)
    """
)


def test_forked_children_print_no_traceback_while_the_watchdog_runs():
    r = subprocess.run([sys.executable, "-c", CHILDREN], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "done", r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr


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
