"""Training: the loop (`python -m speakerlab.train`), the composition root that builds a run, the
device front end, losses and schedules, precision, distributed set-up, batch planning, resume,
checkpoint averaging, the exp-dir lock and the stalled-rank watchdog."""
