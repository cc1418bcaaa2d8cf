"""Train a speaker-embedding model.

    speakerlab-train --config conf/mini/campplus.yaml --exp-dir exp/mini [--hardware cpu] [train.epochs=2 ...]
    torchrun --nproc_per_node=4 --no-python speakerlab-train --config ... --exp-dir ...
    python -m speakerlab.train ...      (the same as speakerlab-train)

Re-running the same command resumes from the latest checkpoint under <exp-dir>/checkpoints.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Optional

import torch

from speakerlab import stopping
from speakerlab.checkpoint import CheckpointError, load_latest, remove_stale_temp_files
from speakerlab.commands import CommandParser
from speakerlab.config import ConfigError, save_config
from speakerlab.dataio.audio import AudioError
from speakerlab.dataio.tables.corpora import train_corpora
from speakerlab.dataio.tables.lists import ListError, rerun_features
from speakerlab.outputs import folder_problem
from speakerlab.train.build import Run, build_run, load_train_config
from speakerlab.train.hardware.speedups import CompileFailed
from speakerlab.train.launch import distributed as dist_utils
from speakerlab.train.launch import preemption
from speakerlab.train.launch.lock import ExpDirLock, ExpDirLocked
from speakerlab.train.launch.watchdog import Watchdog
from speakerlab.train.monitor import Meter
from speakerlab.train.optim.stability import TrainingStopped
from speakerlab.train.state.resume import (
    RunMismatch,
    ScheduleChanged,
    resume,
    run_changes,
    save_epoch_end,
    save_mid_epoch,
    schedule_refusal,
)
from speakerlab.train.state.selection import outcome, selecting, stopped, validate_epoch, validate_start
from speakerlab.train.state.validation import validate_corpora
from speakerlab.train.step import StepResult, settle, train_step


def train_epoch(run: Run, start: int, stop_at: Optional[int]) -> bool:
    """The steps of the current epoch from `start` within it. Returns True when the epoch is complete;
    False when global step `stop_at` (--max-steps) came first, after writing the mid-epoch checkpoint."""
    cfg = run.cfg
    run.sampler.set_epoch(run.state.epoch, start)
    run.net.train()
    batches = iter(run.loader)
    meter, wait, t_log = Meter(), 0.0, time.perf_counter()
    bar = run.monitor.progress(run.steps_per_epoch, start, f"epoch {run.state.epoch + 1}/{cfg.train.epochs}")
    done = start
    preemption.stop_if_requested(run, done)  # a signal since the last step: validation, loader start-up
    while done < run.steps_per_epoch and (stop_at is None or run.state.step < stop_at):
        result = train_step(run, batches)
        done += 1
        wait += result.data_wait_s
        meter.add(result.updated, loss=result.loss, accuracy=result.accuracy, grad_norm=result.grad_norm)
        if bar is not None:
            bar.update(1)
        logs = run.state.step % cfg.train.log_every_steps == 0 or done == run.steps_per_epoch
        every = cfg.train.save_every_steps
        saves = every and run.state.step % every == 0 and done < run.steps_per_epoch
        if not (logs or saves):
            continue  # no host read: the guard's verdicts and the stop signals wait for the next logging step
        signum = settle(run, result)  # may stop training (non-finite steps) before anything is written
        if logs:
            log_step(run, meter, result, wait, time.perf_counter() - t_log)
            wait, t_log = 0.0, time.perf_counter()
        if saves:
            save_mid_epoch(run, done)
        preemption.stop(run, done, signum)  # a signal any rank got before the step's all-reduce
    run.monitor.end_progress()
    settle(run, None)  # --max-steps: the last steps' verdicts before its checkpoint
    preemption.stop_if_requested(run, done)  # a signal after the last step's all-reduce
    if done < run.steps_per_epoch:
        save_mid_epoch(run, done)
        return False
    return True


def end_epoch(run: Run) -> None:
    """Epoch checkpoint, then the validation EER when it is due (every rank embeds its part, rank 0 scores, every
    rank gets it); with model selection (train.keep_best: speakerlab.train.state.selection) the checkpoint again,
    holding it; every rank waits."""
    save_epoch_end(run)
    if validate_epoch(run):
        save_epoch_end(run)
    validate_corpora(run)  # each corpus's own `val` (several corpora in data.train)
    dist_utils.barrier(run.info)


def log_step(run: Run, meter: Meter, last: StepResult, wait: float, elapsed: float) -> None:
    steps = meter.count
    values = meter.reset() or {}
    values = dist_utils.all_reduce_mean(
        {**values, **run.raw.scalars(), "data_wait_fraction": wait / max(elapsed, 1e-9)}, run.info, run.device
    )
    values.update(
        lr=last.lr,
        margin=last.margin,
        skipped_steps=run.guard.total,
        samples_per_s=max(steps, 1) * run.plan.global_batch / max(elapsed, 1e-9),
    )
    values["loss_scale"] = run.scaler.get_scale() if run.precision.use_scaler else 1.0
    values["peak_memory_gb"] = peak_memory_gb(run.device)
    run.monitor.scalars(values, run.state.step)
    run.monitor.metrics(values, run.state.step, epoch=run.state.epoch)
    if run.info.is_main:
        shown = " ".join(f"{k} {v:.4g}" for k, v in values.items())
        run.monitor.log(f"epoch {run.state.epoch + 1} step {run.state.step}: {shown}")


def peak_memory_gb(device: torch.device) -> float:
    """Peak GPU memory allocated by tensors; on CPU the process's peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def parse_args(argv=None) -> argparse.Namespace:
    ap = CommandParser(prog="speakerlab-train", description=__doc__.split("\n")[0])
    ap.add_argument(
        "--config",
        required=True,
        action="append",
        help="YAML config; repeat to overlay (e.g. --config base.yaml --config conf/finetune_lm.yaml)",
    )
    ap.add_argument("--exp-dir", required=True, help="the run's folder: checkpoints, logs; re-run to resume")
    ap.add_argument("--hardware", help="profile under conf/hardware/ (name) or a YAML file")
    ap.add_argument("--threads", help="hardware.threads: CPU threads of each training process, a number or auto")
    ap.add_argument(
        "--max-steps",
        type=positive_int,
        help="stop (with a checkpoint) after this many optimizer steps "
        "of this invocation, e.g. to fit a cluster time limit; the schedule is unaffected",
    )
    ap.add_argument(
        "--force-new-schedule",
        action="store_true",
        help="resume although settings that define the schedule or data order changed (global batch, "
        "epochs, LR, margin, model, data): the interrupted epoch starts again under the new settings",
    )
    ap.add_argument(
        "--check",
        action="store_true",
        help="check the config, its overrides, train.init and that --exp-dir and data.train can be made, then "
        "exit (0: fine; 2: the one-line problem) without reading the data or touching the exp dir",
    )
    ap.add_argument("overrides", nargs="*", help="dotted overrides, anywhere on the line, e.g. train.epochs=2")
    return ap.parse_intermixed_args(argv)


def path_problem(cfg, exp_dir: Path) -> Optional[str]:
    """Why the exp dir cannot be written or a corpus of data.train (a manifest is read by now) cannot be a
    folder, or None."""
    problems = [folder_problem(exp_dir)]
    if cfg.data.train:
        for key, corpus in train_corpora(cfg.data):
            problem = folder_problem(corpus.dir, writable=False)
            if not problem and key != "data.train" and not Path(corpus.dir).exists():
                problem = f"{corpus.dir} does not exist"  # one data dir may be made later; a list names made ones
            problems.append(problem and (problem if key == "data.train" else f"{problem} (config key '{key}')"))
    return next(filter(None, problems), None)


def check_only(cfg, exp_dir: Path, force_new_schedule: bool) -> int:
    """`--check`: the config (with train.init) is loaded and the paths checked already; an exp dir that holds a
    run is compared with its newest intact checkpoint as resuming would (a ConfigError when the run would be
    refused); say so."""
    try:
        found = None if force_new_schedule else load_latest(exp_dir / "checkpoints")
    except CheckpointError as e:
        raise ConfigError(str(e)) from None
    changes = run_changes(found[1], cfg) if found else []
    if changes:
        raise ConfigError(schedule_refusal(exp_dir, changes))
    start = f"train.init {cfg.train.init}" if cfg.train.init else "no train.init: from scratch"
    print(f"speakerlab-train --check: config ok, model {cfg.model.name} ({start}), exp dir {exp_dir} usable")
    return 0


def fit(run: Run, lock: Optional[ExpDirLock], max_steps: Optional[int], force_new_schedule: bool) -> None:
    """Take the exp dir, resume (or start), and train epochs until train.epochs or `max_steps` more steps.
    Nothing is written to the exp dir until the lock is held and the checkpoint fits this command."""
    cfg = run.cfg
    if lock is not None:
        lock.acquire()
        for p in remove_stale_temp_files(run.ckpt_dir):
            run.monitor.log(f"removed {p}, left mid-write by a run that was killed")
    start = resume(run, force_new_schedule)
    run.monitor.start()
    if run.info.is_main:
        save_config(cfg, run.exp_dir / "config.yaml")
    run.monitor.resume_at(run.state.step)
    validate_start(run, start)
    stop_at = run.state.step + max_steps if max_steps else None
    while run.state.epoch < cfg.train.epochs and not stopped(run) and (stop_at is None or run.state.step < stop_at):
        if not train_epoch(run, start, stop_at):
            break
        start, run.state.epoch = 0, run.state.epoch + 1
        end_epoch(run)
    if stopped(run) and run.state.epoch < cfg.train.epochs:
        sel = run.state.selection
        run.monitor.log(
            f"stopped early after epoch {run.state.epoch} of {cfg.train.epochs}, {run.state.step} steps: no "
            f"validation EER below {sel.best_eer * 100:.2f}% (epoch {sel.best_epoch}) in {sel.since_best} "
            f"validation{'s' if sel.since_best > 1 else ''} (train.patience)"
        )
    elif run.state.epoch < cfg.train.epochs:
        run.monitor.log(f"stopped after --max-steps at step {run.state.step}; re-run to continue")
        return
    else:
        run.monitor.log(
            f"training done: {run.state.epoch} epochs, {run.state.step} steps, {run.guard.total} skipped"
            + (f", {run.state.bad_reads} unreadable utterance reads skipped" if run.state.bad_reads else "")
        )
        problem = run.raw.end_of_run_problem()
        if problem:
            raise TrainingStopped(problem)
    if selecting(run):
        run.monitor.log(outcome(run))


def main(argv=None) -> int:
    """Exit codes: 0 done (or stopped by --max-steps); 2 bad input or settings, nothing changed; 3 training
    stopped (repeated non-finite steps, too many unreadable reads, no intact checkpoint); 4 a rank stalled
    (the watchdog's); 75 stopped by SIGTERM or SIGUSR1 after writing the checkpoint (a pre-emption or time limit:
    the same command, or the requeued job, resumes; speakerlab.train.launch.preemption); 130 stopped by Ctrl-C
    (SIGINT) after writing the checkpoint (the same command resumes; nothing requeues it).

    A process of a multi-process run leaves without the interpreter's finalization once its run is over and its
    process group destroyed: finalization ends threads that are still inside torch's C++ code (the store client,
    gloo), which aborts the process (`terminate called without an active exception`, -6) after a run that
    succeeded, and torchrun then reports the job failed (seen in CI under load, on one rank of a two-node run)."""
    code = run(argv)
    if dist_utils.discover_ranks(os.environ)[0].enabled:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def run(argv=None) -> int:
    """The command itself (main's exit codes)."""
    args = parse_args(argv)
    try:
        threads = [f"hardware.threads={args.threads}"] if args.threads else []  # the override, spelt as a flag
        cfg, init = load_train_config(args.config, args.overrides + threads, args.hardware)
        problem = path_problem(cfg, Path(args.exp_dir))
        if problem:
            raise ConfigError(problem)
        if args.check:
            return check_only(cfg, Path(args.exp_dir), args.force_new_schedule)
        run = build_run(cfg, Path(args.exp_dir), init)
    except (ListError, ConfigError, ValueError, ImportError) as e:  # ImportError: the [ssl] extra
        print(f"error: {e}", file=sys.stderr)
        dist_utils.cleanup()
        return 2
    lock = ExpDirLock(run.exp_dir, run.monitor.log) if run.info.is_main else None
    handlers = preemption.install()  # before the loader forks its workers: they inherit it
    watchdog = None
    if run.info.enabled:
        watchdog = Watchdog(run.info.rank, run.info.world_size, cfg.hardware.watchdog_s, run.monitor.log)
        watchdog.start()
    try:
        fit(run, lock, args.max_steps, args.force_new_schedule)
        return 0
    except (ExpDirLocked, ScheduleChanged, RunMismatch, CompileFailed) as e:  # CompileFailed: at the first step
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (TrainingStopped, CheckpointError) as e:
        run.monitor.log(f"error: {e}")
        return 3
    except preemption.Preempted as e:
        return e.code
    except AudioError as e:
        # Raised in a loader worker, it arrives wrapped with the worker's traceback: keep its own line.
        cause = str(e).strip().splitlines()[-1].split("AudioError: ", 1)[-1]
        rerun = rerun_features("speakerlab-prepare", cfg.data.train)
        run.monitor.log(f"error: {cause}; the audio no longer matches the lists ({rerun}); the last checkpoint is kept")
        return 2
    finally:
        if watchdog is not None:
            watchdog.stop()
        run.monitor.close()
        if lock is not None:
            lock.release()
        dist_utils.cleanup()
        stopping.restore(handlers)  # last: torchrun signals the ranks still cleaning up once one has left


if __name__ == "__main__":
    sys.exit(main())
