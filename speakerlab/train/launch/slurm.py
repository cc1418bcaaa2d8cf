"""What a Slurm allocation gives a training launch, read from its environment, and the checks that turn a
wrong allocation into one line before anything starts. `launch` in egs/tools/common.sh calls it:

    python -m speakerlab.train.launch.slurm slurm --gpus all|none --nnodes N|MIN:MAX --requeue auto|true|false
        -> shell assignments (slurm_nodes, slurm_nnodes, slurm_nproc, slurm_cpus, slurm_rdzv, slurm_requeue,
           slurm_where), or `error: ...` and exit 2
    python -m speakerlab.train.launch.slurm host NAME
        -> exit 2 with `error: ...` when NAME does not resolve here (plain multi-node torchrun's master)

Layout of a Slurm launch: one torchrun agent per node (`srun --ntasks-per-node=1`), each starting a
process per GPU Slurm granted on its node (CPU-only jobs: a process per task of the node); the agents
meet by c10d rendezvous on the first host of SLURM_JOB_NODELIST at a port derived from the job id, so
two jobs sharing a node do not collide and a requeued job finds the same port again. Nothing here
imports torch unless the GPU count must be asked of CUDA.
"""

from __future__ import annotations

import re
import shlex
import socket
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable, List, Mapping, Optional

from speakerlab.commands import CommandParser

PORT_BASE, PORT_SPAN = 20000, 10000  # below Linux's ephemeral range (32768-60999)


class LaunchError(ValueError):
    """An allocation or option the launch cannot use; the message is the one line the user sees."""


def first_host(nodelist: str) -> str:
    """The first host of a Slurm hostlist expression: `gpu[03-05,9],cpu1` -> `gpu03`, `a[1-2]b[7-8]` -> `a1b7`
    (Slurm expands every bracket from its first value, leftmost slowest)."""
    depth, end = 0, len(nodelist)
    for i, ch in enumerate(nodelist):
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            end = i
            break
    first = nodelist[:end].strip()
    if not first or depth < 0:
        raise LaunchError(f"cannot read a host from the node list '{nodelist}'")
    return re.sub(r"\[([^\],-]+)[^\]]*\]", r"\1", first)


def rendezvous_port(job_id: str) -> int:
    """The job's rendezvous port: PORT_BASE + job id modulo PORT_SPAN (the same at every start of the job)."""
    digits = re.sub(r"\D", "", job_id)
    if not digits:
        raise LaunchError(f"SLURM_JOB_ID '{job_id}' holds no number")
    return PORT_BASE + int(digits) % PORT_SPAN


def tasks_per_node(text: str) -> List[int]:
    """SLURM_TASKS_PER_NODE (`2(x3),1`) -> one count per node ([2, 2, 2, 1])."""
    counts = []
    for part in filter(None, text.split(",")):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise LaunchError(f"cannot read SLURM_TASKS_PER_NODE '{text}'")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def check_host(host: str, port: int, what: str) -> None:
    """LaunchError naming `what` when `host` does not resolve on this machine."""
    try:
        socket.getaddrinfo(host, port)
    except (socket.gaierror, UnicodeError) as e:
        here = socket.gethostname()
        raise LaunchError(f"{what} '{host}' does not resolve on {here} ({e}); every node must reach it") from None


@dataclass(frozen=True, kw_only=True)
class SlurmPlan:
    job_id: str
    nodes: int  # nodes of the allocation: one agent each
    nnodes: str  # torchrun's --nnodes: the node count, or MIN:MAX for elastic restarts
    nproc: int  # processes per node
    gpus: int  # GPUs per node (0: CPU processes)
    cpus: int  # CPUs of a node, all given to its agent
    rdzv: str  # host:port of the c10d rendezvous
    requeue: bool  # requeue the job when the run was pre-empted
    restarts: int  # SLURM_RESTART_COUNT: how often the job was requeued so far

    def describe(self) -> str:
        on = f"{self.gpus} GPU(s)" if self.gpus else "the CPU"
        return (
            f"Slurm job {self.job_id}: {self.nodes} node(s) x {self.nproc} process(es) on {on}, "
            f"rendezvous {self.rdzv}"
            + (f", elastic --nnodes {self.nnodes}" if ":" in self.nnodes else "")
            + (f", start {self.restarts + 1} (requeued {self.restarts}x)" if self.restarts else "")
            + ("; requeues itself when pre-empted" if self.requeue else "")
        )

    def shell(self) -> str:
        values = dict(
            slurm_nodes=self.nodes,
            slurm_nnodes=self.nnodes,
            slurm_nproc=self.nproc,
            slurm_cpus=self.cpus,
            slurm_rdzv=self.rdzv,
            slurm_requeue="true" if self.requeue else "false",
            slurm_where=self.describe(),
        )
        return "".join(f"{k}={shlex.quote(str(v))}\n" for k, v in values.items())


def visible_gpus() -> int:
    import torch  # only when Slurm did not say how many GPUs it granted

    return torch.cuda.device_count()


def job_requeueable(job_id: str) -> Optional[bool]:
    """Whether Slurm lets job `job_id` requeue: a batch job (an salloc shell cannot be) with `Requeue=1`
    (scontrol show job); None when scontrol cannot say."""
    try:
        out = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    requeue, batch = re.search(r"\bRequeue=(\d)", out.stdout), re.search(r"\bBatchFlag=(\d)", out.stdout)
    return None if requeue is None else requeue.group(1) == "1" and (batch is None or batch.group(1) == "1")


def slurm_plan(
    env: Mapping[str, str],
    nnodes: str = "",
    requeue: str = "auto",
    use_gpus: bool = True,
    gpus: Callable[[], int] = visible_gpus,
    requeueable: Callable[[str], Optional[bool]] = job_requeueable,
) -> SlurmPlan:
    """The launch of the allocation `env` describes (a Slurm batch or salloc shell's environment).

    `nnodes`: torchrun's --nnodes; empty or a plain number means the allocation's node count, MIN:MAX
    keeps MIN:MAX (elastic). `requeue`: auto (when the job allows it), true (error when it does not),
    false. `use_gpus` False: CPU processes whatever the nodes have (a recipe's --gpus none). Raises
    LaunchError for an allocation the launch cannot use."""
    job_id = env.get("SLURM_JOB_ID", "")
    if not job_id:
        raise LaunchError(
            "--launcher slurm needs a Slurm allocation (SLURM_JOB_ID is not set): submit with "
            "`sbatch egs/tools/slurm/train.sbatch ...`, or run inside `salloc`"
        )
    if env.get("SLURM_STEP_ID") not in (None, "", "batch", "extern"):
        raise LaunchError(
            f"--launcher slurm runs srun itself, but this shell is already inside job step "
            f"{job_id}.{env['SLURM_STEP_ID']}: call the recipe from the batch script, not through srun"
        )
    nodes = int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or 1)
    tasks = tasks_per_node(env.get("SLURM_TASKS_PER_NODE", "1"))
    if len(set(tasks)) > 1:
        raise LaunchError(
            f"the job's tasks are spread unevenly over its nodes (SLURM_TASKS_PER_NODE={env['SLURM_TASKS_PER_NODE']}): "
            "ask for `#SBATCH --ntasks-per-node=N` so that every node runs the same number of processes"
        )
    gpu_text = env.get("SLURM_GPUS_ON_NODE", "")
    n_gpus = 0 if not use_gpus else int(gpu_text) if gpu_text.isdigit() else gpus()
    if n_gpus and tasks[0] > n_gpus:
        raise LaunchError(
            f"the job has {tasks[0]} tasks per node but {n_gpus} GPU(s) per node: one agent per node starts a "
            "process per GPU, so set `#SBATCH --ntasks-per-node=1` (or ask for as many GPUs as tasks)"
        )
    if nnodes and not re.fullmatch(r"\d+(:\d+)?", nnodes):
        raise LaunchError(f"--nnodes must be a node count or MIN:MAX, got '{nnodes}'")
    if nnodes and ":" not in nnodes and nnodes != "1" and int(nnodes) != nodes:
        raise LaunchError(f"--nnodes {nnodes} but the Slurm job has {nodes} node(s): leave --nnodes out under Slurm")
    host = first_host(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "")
    port = rendezvous_port(job_id)
    check_host(host, port, "the rendezvous host (the first node of SLURM_JOB_NODELIST)")
    if requeue not in ("auto", "true", "false"):
        raise LaunchError(f"--requeue must be auto, true or false, got '{requeue}'")
    can = requeueable(job_id) if requeue != "false" else False
    if requeue == "true" and not can:
        raise LaunchError(
            f"--requeue true, but Slurm job {job_id} cannot be requeued (submitted without `sbatch --requeue`, "
            "an salloc session, or JobRequeue=0): add `#SBATCH --requeue` to the batch script, or pass --requeue false"
        )
    return SlurmPlan(
        job_id=job_id,
        nodes=nodes,
        nnodes=nnodes if ":" in nnodes else str(nodes),
        nproc=n_gpus or tasks[0],
        gpus=n_gpus,
        cpus=int(env.get("SLURM_CPUS_ON_NODE") or 1),
        rdzv=f"{host}:{port}",
        requeue=bool(can),
        restarts=int(env.get("SLURM_RESTART_COUNT") or 0),
    )


def main(argv=None, env: Optional[Mapping[str, str]] = None) -> int:
    import os

    ap = CommandParser(prog="speakerlab-cluster", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    what = "the launch plan of this Slurm allocation, as shell assignments"
    s = sub.add_parser("slurm", help=what, description=what)
    s.add_argument("--gpus", default="all", help="none: CPU processes; otherwise the GPUs Slurm granted")
    s.add_argument("--nnodes", default="", help="MIN:MAX for an elastic group; empty: the nodes of the allocation")
    s.add_argument("--requeue", default="auto", help="true, false or auto (true when sbatch --requeue allows it)")
    what = "check that a rendezvous host resolves here"
    h = sub.add_parser("host", help=what, description=what)
    h.add_argument("name", help="the host name or address")
    h.add_argument("--port", type=int, default=29500, help="the rendezvous port")
    args = ap.parse_args(argv)
    try:
        if args.what == "slurm":
            plan = slurm_plan(os.environ if env is None else env, args.nnodes, args.requeue, args.gpus != "none")
            print(plan.shell(), end="")
        else:
            check_host(args.name, args.port, "the rendezvous host (--master_addr)")
    except LaunchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
