"""What feeds training: the crop dataset, its sampler and batches (batches.py) and the tar shards (shards.py),
built on tables/ and waveform/."""
