"""speakerlab: speaker-embedding training recipes.

The data flow of training, then of evaluation, and the layer that does each step:

    Kaldi lists, audio            dataio/     lists, trials, audio reading, resampling
      -> worker crop + draws      dataio/     crops of the global-batch order, speed / noise / RIR draws
      -> collate                  dataio/     int16 crops and the drawn noise segments, on the host
      -> device front end         train/      speed, reverb, noise, fbank (features/), mean norm
      -> model -> head            models/, train/   embedding network, margin classifier, loss
      -> checkpoint               checkpoint  the one train -> inference contract
      -> embeddings               inference/  embedder, streaming extraction, export
      -> scores                   scoring/    cosine, normalisation, calibration, EER / minDCF

`config` holds the typed settings every command reads, `commands` the parser every console script's
`--help` comes from; `datasets/` downloads and prepares the corpora, `synth/` builds the synthetic corpus
of egs/mini. tests/test_imports.py holds the layer
table: which layer may import which.
"""

__version__ = "0.1.0"
