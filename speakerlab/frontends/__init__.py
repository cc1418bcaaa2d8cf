"""The front-end registry: every kind of model input computed from audio, one entry each in `FRONT_ENDS`,
which says all there is to say about it: its settings (`FeatureSpec.config`, stored in every checkpoint),
the module that computes it, its width, the keys of a config's `features` section it reads (`FeatureSettings`),
their defaults and rules, and the mapping between that section and the spec, both ways.

    kind           settings            module (speakerlab.features): wave (B, samples) ->
    kaldi_fbank    FbankConfig         Kaldi fbank, mean norm -> (B, T, bins)
    redimnet_mel   ReDimNetMelConfig   the ReDimNet2 releases' log-mel -> (B, T, n_mels)
    waveform       WaveformConfig      the wave, zero mean and unit variance -> (B, samples)
    w2vbert_fbank  W2VBertFbankConfig  w2v-BERT 2.0's stacked fbank -> (B, T, 160)

    feature_spec(cfg.features, cfg.data.sample_rate)   # section -> FeatureSpec (ConfigError naming the key)
    section_keys(spec)                                  # FeatureSpec -> the section's keys (train.init fills them)

A key of the section left out (null) takes the kind's default; a key the kind does not read must be left out.
The package (settings.py: each kind's settings; registry.py: the table, the section, the mapping, FeatureSpec)
is torch-free and imports only speakerlab.settings, because speakerlab.config reads it (the config must load
without torch): so each entry names its module by import path (`module:callable`, called as
`callable(settings, mean_norm)`), which speakerlab.features.spec.build_features resolves.
"""

from speakerlab.frontends.registry import (
    FEATURE_KINDS,
    FRONT_ENDS,
    FeatureSettings,
    FeatureSpec,
    FrontEnd,
    feature_spec,
    section_keys,
)
from speakerlab.frontends.settings import FbankConfig, ReDimNetMelConfig, W2VBertFbankConfig, WaveformConfig

__all__ = [
    "FEATURE_KINDS",
    "FRONT_ENDS",
    "FbankConfig",
    "FeatureSettings",
    "FeatureSpec",
    "FrontEnd",
    "ReDimNetMelConfig",
    "W2VBertFbankConfig",
    "WaveformConfig",
    "feature_spec",
    "section_keys",
]
