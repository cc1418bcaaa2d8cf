"""What the `hardware` section decides for a run: numeric precision, the per-device batch and accumulation that
keep the global batch, and the speed switches (compile, channels_last, cudnn.benchmark)."""
