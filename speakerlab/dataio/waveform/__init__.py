"""The signal transforms: resampling (polyphase filter), speed perturbation, the noise bank, training
augmentation and the stress conditions' degradations. Reads the lists of tables/, never loaders/."""
