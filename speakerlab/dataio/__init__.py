"""Data in, in three rooms around the one audio reader (audio.py, on soundfile: whole files, segments, crops):
tables/ the text tables (Kaldi lists, their columnar and compact forms, prepare, corpora, trial lists, RTTM,
embeddings I/O), waveform/ the signal transforms (resampling, speed perturbation, the noise bank, augmentation,
the stress degradations), loaders/ the training crops, their batches and the tar shards."""
