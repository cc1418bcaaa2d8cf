"""Data in: Kaldi lists and trial lists, audio reading and resampling, speed perturbation, the noise
bank, the training crops and their augmentation draws, batches and tar shards."""
