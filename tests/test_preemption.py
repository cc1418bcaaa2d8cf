"""Pre-emption and restarts lose nothing: SIGTERM / SIGUSR1 stop every rank after one step with a checkpoint
(exit 75), Ctrl-C likewise (exit 130), and the same command resumes exactly; torchrun's elastic agent restarts the
group on the node that remains; start-up preparation runs once per node, on each node's own disk."""

import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from speakerlab.checkpoint import latest_checkpoint, load_checkpoint
from speakerlab.train.loop import main as train_main
from tests.helpers import ROOT, assert_no_traceback, free_port, losses, same_weights, tiny_config, write_wav

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
AGENT = [sys.executable, "-m", "speakerlab.train.launch.agent"]
# The same agent (its launch()), started ahead: it says when torch is imported (the seconds of an agent's start), then
# waits for a line on stdin before it runs.
SECOND_AGENT = [
    sys.executable,
    "-c",
    "import sys, torch.distributed.run; from speakerlab.train.launch.agent import launch; "
    "print('imported', flush=True); sys.stdin.readline(); sys.exit(launch(sys.argv[1:]))",
]
# The elastic test's rendezvous times: the restart after the lost node waits for the node's heartbeats to lapse
# (1 s x 5 missed: torch's default 5 s x 3) and then for the round's last call (torch's default 30 s) alone.
RDZV_TIMES = "last_call_timeout=10,keep_alive_interval=1,keep_alive_max_attempt=5"


def test_signals_in_a_step_stop_after_it_with_a_checkpoint_and_the_resumed_run_is_exact(tmp_path, monkeypatch):
    cfg, _ = tiny_config(tmp_path, val=True)
    assert train_main(["--config", str(cfg), "--exp-dir", str(tmp_path / "a")]) == 0
    real_clip, calls = torch.nn.utils.clip_grad_norm_, []

    def clip(*args, **kwargs):  # SIGUSR1, then SIGTERM, inside the third step
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGUSR1)
            os.kill(os.getpid(), signal.SIGTERM)
        return real_clip(*args, **kwargs)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)
    exp = tmp_path / "b"
    assert train_main(["--config", str(cfg), "--exp-dir", str(exp)]) == 75
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the command's handlers are gone with it
    log = (exp / "train.log").read_text()
    assert (
        f"stopped by SIGTERM at step 3 (epoch 2, 1/2 steps): {exp / 'checkpoints' / 'partial_002.pt'} written; "
        "exit code 75, the same command resumes from it" in log
    )
    assert load_checkpoint(exp / "checkpoints" / "partial_002.pt").step == 3 and sorted(losses(exp)) == [1, 2, 3]
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", real_clip)
    assert train_main(["--config", str(cfg), "--exp-dir", str(exp)]) == 0
    assert same_weights(tmp_path / "a" / "checkpoints" / "epoch_002.pt", exp / "checkpoints" / "epoch_002.pt")


def test_a_signal_is_read_on_the_next_logging_step_and_the_resumed_run_is_exact(tmp_path, monkeypatch):
    """Between logging steps no step reads the signal flags on the host: a SIGTERM in the first step stops the run
    after the second (the epoch's end, a logging step), with its checkpoint, and nothing is lost."""
    cfg, _ = tiny_config(tmp_path, val=False)
    sparse = ("train.log_every_steps=100", "train.save_every_steps=0")
    assert train_main(["--config", str(cfg), "--exp-dir", str(tmp_path / "a"), *sparse]) == 0
    real_clip, calls = torch.nn.utils.clip_grad_norm_, []

    def clip(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_clip(*args, **kwargs)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)
    exp = tmp_path / "b"
    assert train_main(["--config", str(cfg), "--exp-dir", str(exp), *sparse]) == 75
    assert len(calls) == 2 and "stopped by SIGTERM at step 2 (epoch 1, 2/2 steps)" in (exp / "train.log").read_text()
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", real_clip)
    assert train_main(["--config", str(cfg), "--exp-dir", str(exp), *sparse]) == 0
    assert same_weights(tmp_path / "a" / "checkpoints" / "epoch_002.pt", exp / "checkpoints" / "epoch_002.pt")


def test_ctrl_c_stops_with_a_checkpoint_and_130_and_a_second_one_at_once(tmp_path, monkeypatch, capsys, ctrl_c):
    """A first SIGINT (Ctrl-C) is a stop like the scheduler's, with its own exit code (130, never requeued) and the
    same exact resume; a second one raises KeyboardInterrupt at once, and the run resumes from the last checkpoint
    it had."""
    cfg, _ = tiny_config(tmp_path, val=False)
    assert train_main(["--config", str(cfg), "--exp-dir", str(tmp_path / "a")]) == 0
    real_clip, calls, presses = torch.nn.utils.clip_grad_norm_, [], {3: 1}

    def clip(*args, **kwargs):
        calls.append(1)
        for _ in range(presses.get(len(calls), 0)):
            os.kill(os.getpid(), signal.SIGINT)
        return real_clip(*args, **kwargs)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)
    exp = tmp_path / "b"
    assert train_main(["--config", str(cfg), "--exp-dir", str(exp)]) == 130
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Python's own handler is back
    assert "SIGINT (Ctrl-C): the run stops at its next logging step" in capsys.readouterr().err
    log = (exp / "train.log").read_text()
    partial = exp / "checkpoints" / "partial_002.pt"
    assert f"stopped by SIGINT at step 3 (epoch 2, 1/2 steps): {partial} written; exit code 130" in log
    # Two presses in the first step of the resumed run: the second ends it there, no checkpoint written.
    calls.clear()
    presses = {1: 2}
    with pytest.raises(KeyboardInterrupt):
        train_main(["--config", str(cfg), "--exp-dir", str(exp)])
    assert (
        latest_checkpoint(exp / "checkpoints") == partial
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    )
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", real_clip)
    assert train_main(["--config", str(cfg), "--exp-dir", str(exp)]) == 0
    assert same_weights(tmp_path / "a" / "checkpoints" / "epoch_002.pt", exp / "checkpoints" / "epoch_002.pt")


@pytest.mark.slow
def test_ctrl_c_in_a_terminal_with_the_output_through_tee_still_checkpoints(tmp_path):
    """`speakerlab-train ... 2>&1 | tee log` and Ctrl-C, as in a terminal: SIGINT reaches the whole process group, so
    tee dies with it and the run's next console line meets a closed pipe. The run still stops with its checkpoint
    and 130 (it died of that write before: the stop never reached the checkpoint)."""
    cfg, _ = tiny_config(tmp_path, val=False)
    exp = tmp_path / "exp"
    train = f"{sys.executable} -m speakerlab.train --config {cfg} --exp-dir {exp} train.epochs=100000"
    script = f"{train} train.log_every_steps=1 2>&1 | tee {tmp_path / 'console.log'}; exit ${{PIPESTATUS[0]}}"
    proc = subprocess.Popen(
        ["bash", "-c", script],
        env=ENV,
        start_new_session=True,  # a process group of its own, as a terminal's job
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # a terminal's, not the xdist worker's
        stdout=subprocess.DEVNULL,
    )
    wait_for("training steps", lambda: "epoch 3 step" in (exp / "train.log").read_text(), proc, 120)
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=120) == 130
    log = (exp / "train.log").read_text()
    assert re.search(r"stopped by SIGINT at step \d+ .*: .*partial_\d+\.pt written; exit code 130", log), log[-2000:]
    assert "Traceback" not in log


def test_a_process_started_ignoring_ctrl_c_keeps_ignoring_it():
    """A shell script's background job starts with SIGINT ignored (Ctrl-C in the terminal is not for it): the stop
    signals' handlers leave that so, and take SIGTERM and SIGUSR1 as always."""
    from speakerlab import stopping

    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        handlers = stopping.install("it stops")
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN and sorted(handlers) == [
            signal.SIGUSR1,
            signal.SIGTERM,
        ]
        stopping.restore(handlers)
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGINT, before)


def train_module(cfg, exp, *overrides) -> list:
    """The training command after the agent's options: `-m speakerlab.train --config CFG --exp-dir EXP ...`."""
    return ["-m", "speakerlab.train", "--config", str(cfg), "--exp-dir", str(exp), *overrides]


def agent_run(args, timeout=600):
    r = subprocess.run([*AGENT, *args], env=ENV, capture_output=True, text=True, timeout=timeout)
    return r, r.stdout + r.stderr


@pytest.mark.slow
def test_sigterm_to_one_rank_at_five_moments_then_the_same_command_ends_with_the_uninterrupted_weights(tmp_path):
    cfg, _ = tiny_config(tmp_path, val=True)
    overrides = ("train.epochs=8", "hardware.num_workers=1")  # 16 steps; loader workers fork
    two = ["--nproc_per_node=2", f"--master_port={free_port()}"]
    ref, exp = tmp_path / "ref", tmp_path / "signalled"
    r, out = agent_run([*two, *train_module(cfg, ref, *overrides)])
    assert r.returncode == 0, out[-3000:]

    ckpts = exp / "checkpoints"
    rng = random.Random(20261123)
    # (moment, its n-th event in the run, the rank signalled): rank 0 writes checkpoints and validates.
    moments = [
        ("step", rng.randint(1, 2), "1"),
        ("write", rng.randint(1, 2), "0"),
        ("validation", 1, "0"),
        ("loader", rng.randint(1, 2), "1"),
        ("twice", rng.randint(1, 2), "1"),
    ]
    rng.shuffle(moments)
    for kind, n, rank in moments:
        script = [str(ROOT / "tests" / "signal_points.py"), kind, str(n), rank, "--"]
        r, out = agent_run([*two, *script, *train_module(cfg, exp, *overrides)[2:]])
        assert r.returncode == 75, (kind, out[-3000:])
        stopped = re.findall(r"stopped by SIGTERM at step (\d+) \(epoch \d+, \d+/2 steps\): (\S+) written", out)
        assert len(stopped) == 1, (kind, out[-3000:])
        step, path = int(stopped[0][0]), Path(stopped[0][1])
        # The checkpoint named is the newest, whole (its digest is checked on load), at the step the log says.
        assert path == latest_checkpoint(ckpts) and load_checkpoint(path).step == step, kind
        assert not list(ckpts.glob(".*.tmp*")), kind
        assert "Traceback" not in out, (kind, out[-3000:])
    r, out = agent_run([*two, *train_module(cfg, exp, *overrides)])
    assert r.returncode == 0, out[-3000:]
    assert_no_traceback(out)
    assert "training done: 8 epochs, 16 steps" in (exp / "train.log").read_text()
    assert sorted(losses(exp)) == list(range(1, 17))
    assert same_weights(ref / "checkpoints" / "epoch_008.pt", ckpts / "epoch_008.pt")


def wait_for(what, until, proc, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        try:
            if until():
                return
        except (OSError, ValueError):  # a file not written yet, or a line half-written
            pass
        time.sleep(0.2)
    pytest.fail(f"{what}: agent exited with {proc.poll()}")


def kill_tree(pid: int) -> None:
    """SIGKILL a process and every process under it."""
    tree, i = [pid], 0
    while i < len(tree):
        out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(tree[i])], capture_output=True, text=True).stdout
        tree += [int(p) for p in out.split()]
        i += 1
    for p in tree:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.slow
def test_elastic_group_restarts_from_the_last_checkpoint_on_the_agent_that_remains(tmp_path):
    """Two torchrun agents on localhost stand for two nodes (`--nnodes 1:2`); the second is killed with its
    worker (a node lost). The first restarts its worker from the last checkpoint, alone, with the same
    global batch (accumulation 2 instead of 1), and finishes; the log says so in a line."""
    cfg, _ = tiny_config(tmp_path, val=False)
    exp = tmp_path / "exp"
    port = free_port()
    logs = {}

    def agent(name, command, host):
        logs[name] = open(tmp_path / f"agent_{name}.log", "w")
        cmd = [
            *command,
            "--nnodes=1:2",
            "--nproc_per_node=1",
            "--max-restarts=2",
            "--rdzv_backend=c10d",
            f"--rdzv_endpoint=127.0.0.1:{port}",
            "--rdzv_id=elastic-test",
            f"--rdzv_conf=is_host={host},{RDZV_TIMES}",
            *train_module(cfg, exp, "train.epochs=20"),
        ]
        stdin = subprocess.PIPE if command is SECOND_AGENT else None
        return subprocess.Popen(cmd, env=ENV, stdin=stdin, stdout=logs[name], stderr=subprocess.STDOUT, text=True)

    # The second agent imports torch first; then the first starts, hosting the store and the rendezvous (it must be
    # the one that stays; is_host says which is which), and once it listens the second goes on: it joins the first
    # round within a second of the first agent, well within the round's last call.
    procs = [agent("second", SECOND_AGENT, "false")]
    try:
        second_log = tmp_path / "agent_second.log"
        wait_for("the second agent's imports", lambda: "imported" in second_log.read_text(), procs[0])
        procs.insert(0, agent("first", AGENT, "true"))
        first, second = procs

        def listening():
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0

        wait_for("the first agent's rendezvous", listening, first)
        second.stdin.write("go\n")
        second.stdin.close()
        wait_for("training on two processes", lambda: len(losses(exp)) >= 3, first)
        assert "global 8 = 2 device(s) x 4 x accum 1" in (exp / "train.log").read_text()
        kill_tree(second.pid)  # the "node": its agent and the workers (torchrun starts them in sessions of their own)
        second.wait(60)
        assert first.wait(600) == 0, (tmp_path / "agent_first.log").read_text()[-3000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                kill_tree(proc.pid)
        for f in logs.values():
            f.close()
    log = (exp / "train.log").read_text()
    restart = re.findall(r"torchrun restart \d+ after a failed process or node: .*", log)
    assert restart == [
        "torchrun restart 1 after a failed process or node: 1 process(es) on 1 node(s) now; "
        "global 8 = 1 device(s) x 4 x accum 2 (the global batch of the config); resuming from the last checkpoint"
    ], log[-3000:]
    after = log.split(restart[0])[1]
    assert re.search(r"resumed from \S+(partial|epoch)_\d+\.pt: epoch \d+, step \d+", after)
    assert "training done: 20 epochs, 40 steps" in after
    assert sorted(losses(exp)) == list(range(1, 41))


def noise_lists(root: Path) -> Path:
    """MUSAN/RIR-shaped lists of a few float files under `root`, their paths relative to `root`."""
    rng = np.random.default_rng(0)
    lists = root / "musan_rirs"
    lists.mkdir(parents=True)
    waves = {
        "noise": 0.2 * rng.standard_normal(16000),
        "music": 0.3 * np.sin(np.arange(16000) * 0.09),
        "babble": 0.05 * rng.standard_normal(16000),
        "rirs": np.r_[np.zeros(30), 1.0, 0.1 * rng.standard_normal(200)],
    }
    for kind, wave in waves.items():
        path = write_wav(lists / "wav" / f"{kind}.wav", wave, subtype="FLOAT")
        (lists / f"{kind}.scp").write_text(f"{kind}-0 {path}\n")
    return lists


@pytest.mark.slow
def test_two_nodes_with_their_own_disks_prepare_once_each_and_train(tmp_path):
    """Two torchrun agents of 2 processes each, each in a working directory of its own standing for a
    node's local disk: `augment.lists` is relative, so each node reads its own copy of the noise lists
    and needs its own noise bank. Each node builds it exactly once (its local rank 0), the other process
    of the node reads it, and the run trains; the exp dir is shared. `data.train` is relative too: each node's
    own copy of the lists gets its compact arrays (`.compact/`), the shared original none."""
    cfg, train = tiny_config(tmp_path, val=False, extra="augment: {lists: musan_rirs, prob: 1.0, speed_prob: 0.0}")
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    lists = noise_lists(nodes[0])
    shutil.copytree(lists, nodes[1] / "musan_rirs")
    for node in nodes:
        shutil.copytree(train, node / "train")
    exp = tmp_path / "exp"
    port = free_port()
    procs = []
    for rank, node in enumerate(nodes):
        cmd = [
            *AGENT,
            "--nnodes=2",
            f"--node_rank={rank}",
            "--nproc_per_node=2",
            "--master_addr=127.0.0.1",
            f"--master_port={port}",
            *train_module(cfg, exp, "train.epochs=1", "data.train=train"),
        ]
        procs.append(
            subprocess.Popen(cmd, cwd=node, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        )
    outs = [p.communicate(timeout=900)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    assert_no_traceback(*outs)
    building = [re.findall(r"(.*)musan_rirs/bank: no noise bank: building it", out) for out in outs]
    assert len(building[0]) == 1 and building[0][0].startswith("[")  # rank 0: the run's log
    assert building[1] == ["rank 2 on " + socket.gethostname() + " (node-local preparation): "]
    for node in nodes:
        assert (node / "musan_rirs" / "bank" / "index.json").is_file()
        assert (node / "train" / ".compact" / "meta.json").is_file()
    assert not (train / ".compact").exists()
    log = (exp / "train.log").read_text()
    assert "global 8 = 4 device(s) x 2 x accum 1" in log and "training done: 1 epochs, 2 steps" in log


@pytest.mark.slow
def test_the_agent_passes_the_workers_exit_code_on_and_forwards_sigusr1_and_sigint(tmp_path):
    """speakerlab.train.launch.agent over stand-in workers (bash): the code of the failed worker, not torchrun's 1 (the
    other worker, ended by torchrun, counts for nothing); SIGUSR1 to the agent reaches every worker, and the
    agent exits 75; SIGINT likewise, and it exits 130."""
    port = free_port()
    worker = 'if [ "$RANK" = 1 ]; then exit 75; fi; exec sleep 60'
    r, out = agent_run(["--nproc_per_node=2", f"--master_port={port}", "--no-python", "bash", "-c", worker], 120)
    assert r.returncode == 75 and "agent: worker exit codes rank 0: -15, rank 1: 75; exit 75" in out, out[-2000:]
    assert "Traceback" not in out
    # Ctrl-C at the agent (the workers sit in sessions of their own: the terminal's SIGINT reaches the agent only)
    # is passed on as SIGINT like SIGUSR1, and the agent exits 130, on which no wrapper requeues.
    for sig, code in ((signal.SIGUSR1, 75), (signal.SIGINT, 130)):
        name, ready = sig.name[3:], tmp_path / f"ready_{sig.name}"
        # (bash starts a background job with SIGINT ignored: the trap ends the sleep, which holds the agent's stdout.)
        worker = f"trap 'echo rank $RANK got {name}; kill $!; exit {code}' {name}; touch {ready}.$RANK; sleep 60 & wait"
        proc = subprocess.Popen(
            [*AGENT, "--nproc_per_node=2", f"--master_port={port}", "--no-python", "bash", "-c", worker],
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        wait_for("the workers", lambda ready=ready: all(Path(f"{ready}.{r}").exists() for r in "01"), proc, 120)
        proc.send_signal(sig)
        out = proc.communicate(timeout=120)[0]
        assert proc.returncode == code, out[-2000:]
        assert f"rank 0 got {name}" in out and f"rank 1 got {name}" in out
        assert f"agent: {sig.name}: the workers were asked to checkpoint and stop" in out and "Traceback" not in out
