"""Which test file runs when: the longest files first, and each run's seconds per file printed at its end.

tests/run.sh runs two pytest-xdist workers with `--dist loadfile --no-loadscope-reorder`: every file goes whole
to the next free worker, in collection order. xdist's own order (the files with the most tests first) left the
recipes' end-to-end files, one or two tests of minutes each, for last, and one worker ran them alone while the
other idled. Handed out longest first (the largest-processing-time rule), the two workers end within about one
short file of each other. The times are tests/file_seconds.txt, a copy of the table that a full run prints
("seconds per test file"); a file missing from it (a new one) goes after the listed ones. The hooks are imported
by tests/conftest.py. Beside each file's seconds the table prints the CPU seconds its tests used (the worker's and
its finished subprocesses'): a file far under its wall time waits (sleeps, timeouts, disk) rather than computes.
"""

from __future__ import annotations

import resource
from collections import defaultdict
from pathlib import Path
from typing import Dict

TABLE = Path(__file__).with_name("file_seconds.txt")


def file_seconds(path: Path = TABLE) -> Dict[str, float]:
    """`<seconds> <test file> [CPU seconds]` per line ('#' starts a comment) -> {test file: seconds}."""
    seconds = {}
    if path.exists():
        for line in path.read_text().splitlines():
            fields = line.split("#", 1)[0].split()
            if len(fields) in (2, 3):
                seconds[fields[1]] = float(fields[0])
    return seconds


def test_file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(session, config, items):
    seconds = file_seconds()
    # A stable sort: a file's tests stay together and in their own order.
    items.sort(key=lambda item: -seconds.get(test_file(item.nodeid), 0.0))


_spent: Dict[str, float] = defaultdict(float)
_cpu: Dict[str, float] = defaultdict(float)
_by_worker: Dict[str, float] = defaultdict(float)
_started: Dict[str, float] = {}


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and of its children that have ended (subprocess.run's)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def pytest_runtest_logstart(nodeid, location):
    """On the process that runs the test (a worker under xdist), before its setup."""
    _started[nodeid] = cpu_seconds()


def pytest_runtest_makereport(item, call):
    """The CPU seconds of setup, call and teardown ride on the teardown report to the process that prints."""
    if call.when == "teardown" and item.nodeid in _started:
        item.user_properties.append(("cpu_s", cpu_seconds() - _started.pop(item.nodeid)))


def pytest_runtest_logreport(report):
    """Setup, call and teardown of every test, on the process that prints the summary (xdist's controller
    receives the workers' reports, each naming its worker)."""
    _spent[test_file(report.nodeid)] += report.duration
    _cpu[test_file(report.nodeid)] += dict(report.user_properties).get("cpu_s", 0.0)
    node = getattr(report, "node", None)
    worker = getattr(getattr(node, "gateway", None), "id", None)
    if worker is not None:
        _by_worker[worker] += report.duration


def pytest_terminal_summary(terminalreporter):
    if not _spent:
        return
    write = terminalreporter.write_line
    terminalreporter.section("seconds per test file (longest first: the order of tests/file_seconds.txt), CPU seconds")
    for name, seconds in sorted(_spent.items(), key=lambda kv: -kv[1]):
        write(f"{seconds:8.1f} {name} {_cpu[name]:8.1f}")
    write(f"all files: {sum(_spent.values()):.0f} s of tests, {sum(_cpu.values()):.0f} CPU seconds")
    if _by_worker:
        write("per worker: " + ", ".join(f"{w} {s:.0f} s" for w, s in sorted(_by_worker.items())))
