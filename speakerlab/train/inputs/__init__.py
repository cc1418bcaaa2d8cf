"""What feeds the step: the training corpora read into compact lists and this rank's loader over them, and the
device-side pipeline from a loader batch to features and labels (speed, augmentation, the front end's features)."""
