"""A real one-host Slurm (Debian's slurm-wlm: slurmctld + slurmd, munge for authentication) for the tests:
its own config, state directory and ports under a temporary directory, stopped at the end.

    SlurmCluster.unavailable()              # why this machine cannot run it (for pytest.skip), or None
    with SlurmCluster(tmp_dir) as slurm:
        job = slurm.sbatch([...options, script and its arguments...], cwd=...)
        slurm.wait(job, lambda fields: fields["JobState"] == "COMPLETED")

Every Slurm command of the tests runs with `slurm.env` (SLURM_CONF pointing at this cluster's config), so
a Slurm already running on the machine (another test session's, say) is left alone. `.ci/run` installs
slurm-wlm where it is missing.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional

PROGRAMS = ("slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "scancel", "srun", "munged", "munge", "unmunge")

CONFIG = """ClusterName=speakerlabtest
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/log/slurmctld.log
SlurmdLogFile={dir}/log/slurmd.log
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
JobRequeue=1
MpiDefault=none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
FirstJobId={first_job}
SlurmdParameters=config_overrides
NodeName={host} CPUs=8 Boards=1 SocketsPerBoard=1 CoresPerSocket=8 ThreadsPerCore=1 RealMemory=8000 State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""
# The scheduler's passes every second (Slurm's default: 60 s, backfill 30 s): a requeued job whose start time has come
# starts then, not at the next job's end or pass. 8 CPUs are declared whatever the machine has (config_overrides): a
# 2-task job fits beside other work. Job ids start at a random number: the training launch derives its rendezvous
# port from the job id, and another Slurm of the machine (a second test session's) counts its jobs from 1.


def _run(cmd: List[str], env: Optional[Dict[str, str]] = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _munge_works() -> bool:
    try:
        r = subprocess.run("munge -n | unmunge", shell=True, capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return False
    return r.returncode == 0 and "Success" in r.stdout


class SlurmCluster:
    def __init__(self, directory: Path):
        self.dir = Path(directory)
        self.host = socket.gethostname().split(".")[0]
        self.ctld_port, self.slurmd_port = _free_port(), _free_port()
        self.conf = self.dir / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    @staticmethod
    def unavailable() -> Optional[str]:
        """Why this machine cannot run the test cluster, or None when it can."""
        missing = [p for p in PROGRAMS if shutil.which(p) is None]
        if missing:
            return f"Slurm is not installed (no {', '.join(missing)}; apt-get install slurm-wlm munge)"
        if os.geteuid() != 0:
            return "the test Slurm runs its daemons as root, and this is not root"
        return None

    def __enter__(self) -> "SlurmCluster":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        for sub in ("state", "spool", "log"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self.conf.write_text(
            CONFIG.format(
                host=self.host,
                dir=self.dir,
                ctld_port=self.ctld_port,
                slurmd_port=self.slurmd_port,
                first_job=random.randint(1000, 9000),
            )
        )
        if not _munge_works():  # one munged serves every Slurm of the machine: start it only when none answers
            Path("/run/munge").mkdir(parents=True, exist_ok=True)
            shutil.chown("/run/munge", "munge", "munge")
            _run(["su", "-s", "/bin/sh", "munge", "-c", "/usr/sbin/munged"])
            if not _munge_works():
                raise RuntimeError("munged does not answer (munge -n | unmunge)")
        for daemon in ("slurmctld", "slurmd"):
            r = _run([daemon, "-f", str(self.conf)], self.env)
            if r.returncode != 0:
                raise RuntimeError(f"{daemon} did not start: {r.stderr}{self.log_tail()}")
        deadline = time.time() + 120
        while time.time() < deadline:
            r = _run(["sinfo", "-h", "-o", "%t"], self.env)
            if r.returncode == 0 and r.stdout.strip() in ("idle", "mix", "alloc"):
                return
            time.sleep(0.25)
        raise RuntimeError(f"the test Slurm node did not come up: {r.stdout}{r.stderr}{self.log_tail()}")

    def stop(self) -> None:
        jobs = _run(["squeue", "-h", "-o", "%i"], self.env).stdout.split()
        if jobs:
            _run(["scancel", *jobs], self.env)
        _run(["scontrol", "shutdown"], self.env)
        for pid_file in ("slurmctld.pid", "slurmd.pid"):
            path = self.dir / pid_file
            deadline = time.time() + 30
            while path.exists() and time.time() < deadline:
                try:
                    os.kill(int(path.read_text().strip() or 0), 0)
                except (ValueError, ProcessLookupError):
                    break
                time.sleep(0.5)

    def log_tail(self, n: int = 3000) -> str:
        text = ""
        for name in ("slurmctld.log", "slurmd.log"):
            path = self.dir / "log" / name
            if path.exists():
                text += f"\n--- {name}\n" + path.read_text(errors="replace")[-n:]
        return text

    def sbatch(self, args: List[str], cwd: Path) -> str:
        """Submit from `cwd` (the job's working directory); returns the job id."""
        r = subprocess.run(
            ["sbatch", "--parsable", *args], cwd=cwd, env=self.env, capture_output=True, text=True, timeout=60
        )
        if r.returncode != 0:
            raise RuntimeError(f"sbatch {' '.join(args)}: {r.stderr}")
        return r.stdout.strip().split(";")[0]

    def scancel_signal(self, job_id: str, name: str) -> None:
        """`scancel --signal=NAME JOB`: to every process of the job's steps (not the batch shell)."""
        r = _run(["scancel", f"--signal={name}", job_id], self.env)
        if r.returncode != 0:
            raise RuntimeError(f"scancel --signal={name} {job_id}: {r.stderr}")

    def start_now(self, job_id: str) -> None:
        """Let a requeued job start in 3 s, not ~2 min (Slurm's hold after a requeue). Not at once: slurmd
        revoked the credential of the start that was requeued, and credentials compare by the second, so a new
        start in that same second is refused ("Job credential revoked") and the job ends FAILED (seen in CI)."""
        r = _run(["scontrol", "update", f"jobid={job_id}", "StartTime=now+3"], self.env)
        if r.returncode != 0:
            raise RuntimeError(f"scontrol update jobid={job_id} StartTime=now+3: {r.stderr}")

    def job(self, job_id: str) -> Dict[str, str]:
        """`scontrol show job` as a dict (JobState, Restarts, ExitCode, Requeue, ...)."""
        out = _run(["scontrol", "-o", "show", "job", job_id], self.env).stdout
        fields = {}
        for item in out.split():
            key, _, value = item.partition("=")
            fields.setdefault(key, value)
        return fields

    def wait(self, job_id: str, until, timeout: float = 600, what: str = "") -> Dict[str, str]:
        deadline = time.time() + timeout
        while time.time() < deadline:
            fields = self.job(job_id)
            if until(fields):
                return fields
            time.sleep(0.25)  # a scontrol call: cheap, and the tests wait on these
        raise TimeoutError(f"job {job_id} {what}: still {self.job(job_id)}{self.log_tail()}")
