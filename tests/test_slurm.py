"""Training under a real Slurm on this machine (tests/slurm_cluster.py: slurmctld + slurmd + munge of Debian's
slurm-wlm, a configuration and ports of their own). The shipped template egs/tools/slurm/train.sbatch runs the
mini recipe's training stage on a tiny config with 2 CPU processes (gloo); one job is signalled mid-epoch with
`scancel --signal=USR1`, requeues itself and ends with the weights of a job that ran uninterrupted. Where
Slurm is not installed the tests skip, saying why (.ci/run installs it)."""

import re
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, losses, make_data_dir, same_weights, tiny_config
from tests.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slow

TEMPLATE = ROOT / "egs" / "tools" / "slurm" / "train.sbatch"
# 256 utterances in global batches of 4: 64 steps per epoch, so that a signal lands mid-epoch (with 16 steps, a
# job training at ~100 samples/s had finished the epoch before scancel's signal arrived).
TRAIN = "train.epochs=2 train.global_batch_size=4 hardware.per_device_batch=2 train.save_every_steps=0"


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    why = SlurmCluster.unavailable()
    if why:
        pytest.skip(why)
    with SlurmCluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("slurm_data")
    cfg, _ = tiny_config(root, val=True)
    make_data_dir(root / "train", {f"s{s}-{u}": f"s{s}" for s in range(4) for u in range(64)}, seconds=0.6)
    return root, cfg


def submit(slurm, tiny, exp: Path, *sbatch_options: str, recipe_options=()) -> str:
    """sbatch of the shipped template, its #SBATCH lines overridden for this one-host CPU cluster as a
    user's edit would: 2 tasks (CPU processes) on the node, no GPU, the test partition, memory it has."""
    root, cfg = tiny
    job = slurm.sbatch(
        [
            "--partition=debug",
            "--gpus-per-node=0",
            "--ntasks-per-node=2",
            "--cpus-per-task=1",
            "--mem=1000",
            "--time=30",
            f"--output={exp}.out",
            *sbatch_options,
            str(TEMPLATE),
            str(ROOT / "egs" / "mini" / "run.sh"),
            *("--stage", "3", "--stop_stage", "3", "--data", str(root), "--config", str(cfg), "--exp", str(exp)),
            *("--hardware", "cpu", "--train_overrides", TRAIN, *recipe_options),
        ],
        cwd=root,
    )
    return job


def output(exp: Path) -> str:
    path = Path(f"{exp}.out")
    return path.read_text(errors="replace") if path.exists() else ""


def ended(fields) -> bool:
    return fields.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


def test_a_signalled_job_requeues_itself_and_ends_with_the_uninterrupted_weights(slurm, tiny, tmp_path):
    ref, exp = tmp_path / "uninterrupted", tmp_path / "signalled"
    ref_job, job = submit(slurm, tiny, ref), submit(slurm, tiny, exp)

    def trained(n):
        try:
            return len(losses(exp)) >= n
        except (OSError, ValueError):
            return False

    slurm.wait(job, lambda f: trained(3) or ended(f), what="training 3 steps")
    slurm.scancel_signal(job, "USR1")
    requeued = slurm.wait(job, lambda f: int(f.get("Restarts", 0)) >= 1 or ended(f), what="requeueing itself")
    assert int(requeued["Restarts"]) == 1, output(exp)[-3000:]
    slurm.start_now(job)  # Slurm holds a requeued job ~2 min before it may start again
    for j, e in ((job, exp), (ref_job, ref)):
        fields = slurm.wait(j, ended, what="finishing")
        ok = fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0"
        assert ok, f"{fields}\n{output(e)[-3000:]}\n{slurm.log_tail()}"
    text = output(exp)
    stopped = re.findall(
        r"stopped by SIGUSR1 at step (\d+) \(epoch 1, (\d+)/64 steps\): (\S+) written; exit code 75", text
    )
    assert len(stopped) == 1 and 0 < int(stopped[0][1]) < 64, text[-3000:]  # mid-epoch
    assert f"launch: pre-empted, checkpoint written; requeueing Slurm job {job}" in text
    log = (exp / "train.log").read_text()
    assert f"Slurm job {job} requeued, start 2; global 4 = 2 device(s) x 2 x accum 1" in log
    assert f"resumed from {stopped[0][2]}: epoch 0, step {stopped[0][0]}" in log
    assert "training done: 2 epochs, 128 steps" in log and "Traceback" not in text
    assert same_weights(ref / "checkpoints" / "epoch_002.pt", exp / "checkpoints" / "epoch_002.pt")


def test_requeue_asked_of_a_job_that_cannot_requeue_is_one_line(slurm, tiny, tmp_path):
    exp = tmp_path / "norequeue"
    job = submit(slurm, tiny, exp, "--no-requeue", recipe_options=("--requeue", "true"))
    fields = slurm.wait(job, ended, what="failing")
    assert fields["ExitCode"] == "2:0" and not exp.exists(), output(exp)[-3000:]
    errors = [line for line in output(exp).splitlines() if line.startswith("error")]
    assert errors == [
        f"error: --requeue true, but Slurm job {job} cannot be requeued (submitted without `sbatch --requeue`, "
        "an salloc session, or JobRequeue=0): add `#SBATCH --requeue` to the batch script, or pass --requeue false"
    ]


def test_srun_without_torchrun_trains_with_the_ranks_slurm_gives(slurm, tiny, tmp_path):
    """`srun -n2 python -m speakerlab.train ...` in a batch script: each task finds its rank from
    SLURM_PROCID/SLURM_LOCALID/SLURM_NTASKS, rank 0 hosts the process group on the step's first host."""
    root, cfg = tiny
    exp = tmp_path / "srun"
    train = f"--config {cfg} --exp-dir {exp} {TRAIN.replace('train.epochs=2', 'train.epochs=1')}"
    wrap = f"OMP_NUM_THREADS=1 srun --ntasks=2 {sys.executable} -m speakerlab.train {train}"
    job = slurm.sbatch(["--partition=debug", "-n2", "--cpus-per-task=1", f"--output={exp}.out", f"--wrap={wrap}"], root)
    fields = slurm.wait(job, ended, what="finishing")
    assert fields["ExitCode"] == "0:0", output(exp)[-3000:]
    log = (exp / "train.log").read_text()
    assert "global 4 = 2 device(s) x 2 x accum 1; 64 steps/epoch" in log and "training done: 1 epochs, 64 steps" in log
