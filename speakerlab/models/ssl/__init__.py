"""Speaker models on self-supervised encoders (transformers: WavLM, wav2vec 2.0, HuBERT, w2v-BERT 2.0).

Importing this package registers the builders (ssl_mhfa, ssl_ecapa_tdnn, ssl_mfa); transformers and peft
(`pip install -e .[ssl]`) are imported only when a model is built.
"""

from speakerlab.models.ssl import speaker  # noqa: F401  (registers the builders)
from speakerlab.models.ssl.base import SSLModel

__all__ = ["SSLModel"]
