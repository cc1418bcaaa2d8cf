"""A run's state over time: where its weights start (train.init), its checkpoints and resume, validation and model
selection, and the average of its last checkpoints."""
