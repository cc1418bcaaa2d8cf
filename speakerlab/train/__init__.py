"""Training. The command and its epochs are `loop.py` (`speakerlab-train`, `python -m speakerlab.train`), one
optimizer step is `step.py`, and `build.py` is the composition root that turns a config into a run; `monitor.py`
reports, `scaled.py` scales fine-tuning defaults to the data. The rest, by concern:

    inputs/     corpora and loaders; the device-side pipeline from a loader batch to features and labels
    losses/     the margin heads, sharded over ranks or whole, and their rows in checkpoints
    optim/      parameter groups, LR / margin schedules, freezing, the non-finite guard
    hardware/   precision, the per-device batch plan, speed switches
    launch/     process groups, torchrun's agent, Slurm, pre-emption, the watchdog, the exp-dir lock
    state/      train.init, checkpoints and resume, validation and model selection, averaging
"""
