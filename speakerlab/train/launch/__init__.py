"""How a run gets its processes and keeps them honest: process groups (torchrun, srun), torchrun's agent as the
recipes start it, what a Slurm allocation gives, pre-emption signals, the stalled-rank watchdog and the exp-dir
lock."""
