"""The text tables: Kaldi data dirs (lists), their columnar and compact numpy forms, speakerlab-prepare, the
training corpora, trial lists, RTTM and the embeddings I/O. Reads nothing of waveform/ or loaders/."""
