"""The agent hosting the rendezvous store leaves torch's exit barrier after the other agents
(speakerlab.train.launch.agent; pytorch/pytorch#69520): a second node's agent held between its check-in and its
wait must still get its answer, not a closed connection (which failed the two-node recipe test in CI)."""

import datetime
import subprocess
import sys
import textwrap
import time

import pytest
import torch.distributed as dist
from torch.distributed.elastic.utils import store as store_util

from speakerlab.train.launch.agent import LEFT_KEY, leave_in_order, listens_on

# Node 0's agent: hosts the store, goes through the agent's exit barrier (torch's own, or with the repair
# when "repaired" is given) once its workers are done, then exits, which takes the store down.
HOST = textwrap.dedent(
    """
    import datetime, sys, types
    import torch.distributed as dist
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
    from speakerlab.train.launch import agent

    if sys.argv[1] == "repaired":
        agent._keep_the_store_until_all_left()
    store = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=datetime.timedelta(seconds=30), wait_for_workers=False)
    print(store.port, flush=True)
    prefixed = dist.PrefixStore("t", store)
    group = types.SimpleNamespace(group_world_size=2, state="SUCCEEDED", store=prefixed)
    # What torch's exit barrier reads (private), and the public worker group the repair reads.
    fake = types.SimpleNamespace(_store=prefixed, _worker_group=group, get_worker_group=lambda: group,
                                 _exit_barrier_timeout=30, _in_exit_barrier=False)
    SimpleElasticAgent._exit_barrier(fake)
    """
)


def held_until_the_host_is_through(host: subprocess.Popen, store) -> None:
    """Node 1 held (a loaded node) until node 0 has passed torch's barrier: node 0 has exited (torch alone)
    or checked out and waits for us (repaired). An event, not a sleep: no window a slow machine can miss."""
    deadline = time.monotonic() + 60
    while host.poll() is None and time.monotonic() < deadline:
        try:
            if store.add(LEFT_KEY, 0) >= 1:
                return
        except dist.DistError:  # the store went down between the poll and the read: node 0 has exited
            host.wait(timeout=60)
            return
        time.sleep(0.02)
    assert host.poll() is not None, "node 0 neither exited nor checked out within 60 s"


def second_agent_through_the_barrier(mode: str) -> None:
    """Node 1's agent: checks in to the exit barrier, is held until node 0 is through it, then waits;
    raises what its store raises."""
    host = subprocess.Popen([sys.executable, "-c", HOST, mode], stdout=subprocess.PIPE, text=True)
    try:
        port = int(host.stdout.readline())
        client = dist.TCPStore("127.0.0.1", port, 2, False, timeout=datetime.timedelta(seconds=30))
        store = dist.PrefixStore("t", client)
        key = store_util._barrier_nonblocking(store, 2, "torchelastic/agent/terminal_state")
        held_until_the_host_is_through(host, store)
        store.wait([key])
        leave_in_order(store, 2, hosting=False)
    finally:
        assert host.wait(timeout=60) == 0


def test_torchs_own_exit_barrier_leaves_the_second_agent_talking_to_nobody():
    with pytest.raises(dist.DistError):
        second_agent_through_the_barrier("torch")


def test_the_host_waits_for_the_second_agent_to_leave():
    second_agent_through_the_barrier("repaired")


def test_the_host_is_the_process_listening_on_the_port():
    server = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=5))
    client = dist.TCPStore("127.0.0.1", server.port, 1, False, timeout=datetime.timedelta(seconds=5))
    assert listens_on(client.port)  # this process holds the server
    started = time.monotonic()
    leave_in_order(client, 1, hosting=True)  # alone: nobody to wait for
    assert time.monotonic() - started < 5
    other = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from speakerlab.train.launch.agent import listens_on; print(listens_on({server.port}))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert other.stdout.strip() == "False"  # a client on the same machine does not host it
