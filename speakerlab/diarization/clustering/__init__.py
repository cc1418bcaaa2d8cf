"""Clustering of a recording's embeddings: spectral / AHC with capped units (cluster), VBx (vbx) on a PLDA (plda; the
fit of `speakerlab-plda`: plda_fit). Numpy and scipy only: the torch-free runtime ships it."""
