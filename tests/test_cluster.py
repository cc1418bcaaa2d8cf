"""The cluster path without a cluster: rank discovery (torchrun, srun, a batch shell), what a Slurm allocation
becomes (speakerlab.train.launch.slurm), the one-line errors of a launch that cannot work (through the recipes'
`launch`), the restart log line and the exp-dir lock across restarts of one job."""

import os
import subprocess
import sys

import pytest

from speakerlab.train.launch.distributed import DistInfo, discover_ranks, restart_note
from speakerlab.train.launch.lock import ExpDirLock, ExpDirLocked
from speakerlab.train.launch.slurm import (
    LaunchError,
    first_host,
    main,
    rendezvous_port,
    slurm_plan,
    tasks_per_node,
)
from tests.helpers import ROOT

HOST = "localhost"  # resolves everywhere


def test_torchrun_ranks_win_over_slurm_ones():
    """torchrun started by srun: SLURM_PROCID is the agent's (the node's), RANK the process's."""
    env = {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}
    env.update(SLURM_STEP_ID="0", SLURM_PROCID="1", SLURM_NTASKS="2", SLURM_JOB_NODELIST="gpu[1-2]")
    assert discover_ranks(env) == (DistInfo(5, 1, 8, 4, "torchrun"), None)


def test_srun_tasks_find_their_ranks_and_rank_zeros_host():
    env = {
        "SLURM_JOB_ID": "4321",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "3",
        "SLURM_LOCALID": "1",
        "SLURM_NTASKS": "4",
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        "SLURM_STEP_NODELIST": "node[07-08]",
        "SLURM_JOB_NODELIST": "node[05-08]",
    }
    info, url = discover_ranks(env)
    assert info == DistInfo(rank=3, local_rank=1, world_size=4, local_world_size=2, launcher="srun")
    assert url == f"tcp://node07:{rendezvous_port('4321')}" == "tcp://node07:24321"


@pytest.mark.parametrize(
    "env",
    [
        {},  # a plain process
        # The batch shell of `sbatch -n2`: SLURM_PROCID=0 and SLURM_NTASKS=2, but it is no task of a step.
        {"SLURM_JOB_ID": "9", "SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "vm"},
        # `srun -n1 speakerlab-train`: a step of one task.
        {"SLURM_JOB_ID": "9", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"},
    ],
)
def test_one_process_when_nothing_says_there_are_more(env):
    assert discover_ranks(env) == (DistInfo(), None)


@pytest.mark.parametrize(
    "nodelist, first",
    [("vm", "vm"), ("gpu[03-05,9],cpu1", "gpu03"), ("a[1-2]b[7-8]", "a1b7"), ("n1,n2", "n1"), ("x-[10-11]", "x-10")],
)
def test_first_host_of_a_hostlist(nodelist, first):
    assert first_host(nodelist) == first


def test_tasks_per_node_and_ports():
    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1] and tasks_per_node("4") == [4]
    assert rendezvous_port("123") == 20123 and rendezvous_port("99999") == 29999


def allocation(**extra):
    env = {
        "SLURM_JOB_ID": "812",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_NODELIST": HOST,
        "SLURM_TASKS_PER_NODE": "1(x2)",
        "SLURM_CPUS_ON_NODE": "32",
    }
    env.update(extra)
    return env


def plan(env, nnodes="", requeue="auto", use_gpus=True, gpus=0, requeueable=True):
    return slurm_plan(env, nnodes, requeue, use_gpus, gpus=lambda: gpus, requeueable=lambda job: requeueable)


def test_gpu_nodes_get_one_agent_with_a_process_per_gpu():
    p = plan(allocation(SLURM_GPUS_ON_NODE="4"))
    assert (p.nodes, p.nnodes, p.nproc, p.gpus, p.cpus) == (2, "2", 4, 4, 32)
    assert p.rdzv == f"{HOST}:20812" and p.requeue
    assert "Slurm job 812: 2 node(s) x 4 process(es) on 4 GPU(s), rendezvous localhost:20812" in p.describe()
    # CUDA's count when Slurm does not say; elastic --nnodes kept; a requeued start says so.
    p = plan(allocation(SLURM_RESTART_COUNT="2"), nnodes="1:2", gpus=2)
    assert (p.nproc, p.nnodes, p.restarts) == (2, "1:2", 2) and "start 3 (requeued 2x)" in p.describe()
    assert "slurm_nproc=2\n" in p.shell() and "slurm_rdzv=localhost:20812\n" in p.shell()


def test_cpu_jobs_run_a_process_per_task():
    p = plan(allocation(SLURM_JOB_NUM_NODES="1", SLURM_TASKS_PER_NODE="2", SLURM_CPUS_ON_NODE="2"), gpus=0)
    assert (p.nodes, p.nproc, p.gpus, p.cpus) == (1, 2, 0, 2)
    # --gpus none: CPU processes even where CUDA sees GPUs
    p = plan(allocation(SLURM_TASKS_PER_NODE="3(x2)"), use_gpus=False, gpus=8)
    assert (p.nproc, p.gpus) == (3, 0)


@pytest.mark.parametrize(
    "env, kwargs, message",
    [
        ({}, {}, "--launcher slurm needs a Slurm allocation (SLURM_JOB_ID is not set): submit with `sbatch"),
        (
            allocation(SLURM_TASKS_PER_NODE="8(x2)", SLURM_GPUS_ON_NODE="4"),
            {},
            "the job has 8 tasks per node but 4 GPU(s) per node: one agent per node starts a process per GPU, "
            "so set `#SBATCH --ntasks-per-node=1`",
        ),
        (
            allocation(SLURM_JOB_NODELIST="no-such-node-of-speakerlab.invalid"),
            {},
            "the rendezvous host (the first node of SLURM_JOB_NODELIST) 'no-such-node-of-speakerlab.invalid' "
            "does not resolve on",
        ),
        (
            allocation(),
            {"requeue": "true", "requeueable": False},
            "--requeue true, but Slurm job 812 cannot be requeued (submitted without `sbatch --requeue`",
        ),
        (allocation(SLURM_TASKS_PER_NODE="2,1"), {}, "the job's tasks are spread unevenly over its nodes"),
        (allocation(SLURM_STEP_ID="0"), {}, "this shell is already inside job step 812.0"),
        (allocation(), {"nnodes": "3"}, "--nnodes 3 but the Slurm job has 2 node(s)"),
        (allocation(), {"requeue": "maybe"}, "--requeue must be auto, true or false, got 'maybe'"),
    ],
)
def test_allocations_a_launch_cannot_use_are_one_line(env, kwargs, message):
    with pytest.raises(LaunchError) as e:
        plan(env, **kwargs)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_requeue_auto_follows_the_job():
    assert not plan(allocation(), requeueable=False).requeue
    assert not plan(allocation(), requeue="false").requeue


def test_cli_prints_the_error_line_and_exits_2(capsys):
    assert main(["slurm"], env={}) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --launcher slurm needs a Slurm allocation") and err.count("\n") == 1


RECIPE_SHELL = """
set -euo pipefail
. egs/tools/common.sh
launch_options none
stage=1 stop_stage=1
. egs/tools/parse_options.sh
launch echo launched
"""


def run_launch(*options, env=None):
    """`launch echo launched` of a recipe shell with `options` (egs/tools/common.sh)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    base["PATH"] = f"{os.path.dirname(sys.executable)}:{base['PATH']}"
    base["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        ["bash", "-c", RECIPE_SHELL, "recipe", *options],
        cwd=ROOT,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_recipe_launch_outside_an_allocation_is_one_line():
    r = run_launch("--launcher", "slurm")
    assert r.returncode == 2 and "launched" not in r.stdout
    assert r.stderr.strip().splitlines() == [
        "error: --launcher slurm needs a Slurm allocation (SLURM_JOB_ID is not set): submit with "
        "`sbatch egs/tools/slurm/train.sbatch ...`, or run inside `salloc`"
    ]


def test_recipe_launch_to_a_master_that_does_not_resolve_is_one_line():
    r = run_launch("--nnodes", "2", "--master_addr", "no-such-master-of-speakerlab.invalid")
    assert r.returncode == 2 and "launched" not in r.stdout
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(
        "error: the rendezvous host (--master_addr) 'no-such-master-of-speakerlab.invalid' does not resolve on"
    )


def test_recipe_launch_detects_nothing_outside_slurm_and_runs_the_command():
    r = run_launch()
    assert r.returncode == 0 and r.stdout == "launched\n" and "launch: 1 process(es) on the CPU" in r.stderr
    # A process inside a job step is no allocation shell: auto stays local.
    r = run_launch(env={"SLURM_JOB_ID": "5", "SLURM_STEP_ID": "0"})
    assert r.returncode == 0 and r.stdout == "launched\n"


def test_restart_note():
    info = DistInfo(0, 0, 2, 1, "torchrun")
    assert restart_note(info, {}) is None
    note = restart_note(info, {"TORCHELASTIC_RESTART_COUNT": "1", "SLURM_RESTART_COUNT": "1", "SLURM_JOB_ID": "7"})
    assert note == (
        "Slurm job 7 requeued, start 2; torchrun restart 1 after a failed process or node: "
        "2 process(es) on 2 node(s) now"
    )


def test_lock_of_an_earlier_start_of_the_same_job_on_another_host_is_taken_over(tmp_path, monkeypatch):
    """A node that held rank 0 is gone: the restarted job must not wait for its lock; another job must."""
    (tmp_path / ".lock").write_text("gone-node 4242 2026-01-01 00:00:00 job=812:0:0\n")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "812")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    lines = []
    with pytest.raises(ExpDirLocked, match="in use by process 4242 on host gone-node"):
        ExpDirLock(tmp_path, lines.append).acquire()  # the same start: a second run, not a restart
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "813")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    with pytest.raises(ExpDirLocked):
        ExpDirLock(tmp_path, lines.append).acquire()  # another job
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "812")
    lock = ExpDirLock(tmp_path, lines.append)
    lock.acquire()
    assert lines == [
        f"removing the lock {tmp_path / '.lock'} of process 4242 on gone-node, an earlier start of job 812"
    ]
    assert (tmp_path / ".lock").read_text().split()[-1] == "job=812:0:1"
    lock.release()


def test_the_batch_script_stops_in_one_line_where_the_environment_is_not_active(tmp_path):
    """egs/tools/slurm/train.sbatch on a compute node whose `python` is not the environment that installs
    speakerlab (a job started with a clean environment): exit 2 with one line saying what to activate, before the
    recipe runs; with the environment it goes on to the recipe (here its usage line)."""
    template = ROOT / "egs" / "tools" / "slurm" / "train.sbatch"
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python").write_text("#!/bin/sh\nexit 1\n")  # a python without speakerlab
    (bare / "python").chmod(0o755)
    recipe = ["bash", str(template), str(ROOT / "egs" / "mini" / "run.sh"), "--no_such_option", "1"]
    env = {**os.environ, "PATH": f"{bare}:{os.environ['PATH']}"}
    r = subprocess.run(recipe, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"the python on {os.uname().nodename} ({bare / 'python'}) does not import this speakerlab" in r.stderr
    here = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    r = subprocess.run(recipe, env=here, capture_output=True, text=True, timeout=60)
    assert "does not import" not in r.stderr and "Slurm job ? start 1" in r.stderr, r.stderr
