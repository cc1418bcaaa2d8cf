"""The cache of speech regions and sub-segment embeddings (speakerlab.diarization.cache): a second system
diarizing the same recording runs neither the VAD nor the embedder, and gets what it would get without the
cache; other window settings, another VAD or a rewritten file are not served from it."""

from __future__ import annotations

import numpy as np
import torch

from speakerlab.diarization import DiarizeOptions, Diarizer, SpeakerCount
from speakerlab.diarization.cache import FrontCache
from speakerlab.diarization.vad import EnergyVad
from speakerlab.frontends import FbankConfig, FeatureSpec
from speakerlab.inference.embedder import Embedder
from tests.helpers import write_wav
from tests.test_diarization import THREE, diarize, spectral_shape_embedder, talk


class Counting:
    """Wraps a callable or an embedder, counting calls (VAD calls; `embed_waves` windows)."""

    def __init__(self, inner):
        self.inner, self.calls, self.windows = inner, 0, 0

    def __call__(self, *args):
        self.calls += 1
        return self.inner(*args)

    def __repr__(self):
        return repr(self.inner)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def embed_waves(self, waves, **kw):
        self.windows += len(waves)
        return self.inner.embed_waves(waves, **kw)


def test_a_second_system_reuses_the_speech_and_embeddings(tmp_path):
    shape_embedder = spectral_shape_embedder()
    wav = str(write_wav(tmp_path / "three.wav", talk(*THREE)[0]))
    vad, embedder = Counting(EnergyVad()), Counting(shape_embedder)
    cache = FrontCache(tmp_path / "cache")
    count = SpeakerCount(1, 6)
    first = Diarizer(embedder, vad, DiarizeOptions(), cache=cache).diarize_file(wav, count)
    assert first.cached == [] and vad.calls == 1 and embedder.windows == len(first.subsegments) > 10
    ahc = Diarizer(embedder, vad, DiarizeOptions(method="ahc"), cache=cache)
    second = ahc.diarize_file(wav, count)
    assert second.cached == ["speech", "embeddings"] and vad.calls == 1 and embedder.windows == len(first.subsegments)
    alone = Diarizer(shape_embedder, EnergyVad(), DiarizeOptions(method="ahc")).diarize_file(wav, count)
    assert np.array_equal(second.embeddings, alone.embeddings) and second.turns == alone.turns
    # Other windows: the speech is reused, the embeddings are made again.
    wider = Diarizer(embedder, vad, DiarizeOptions(window=2.0, hop=1.0), cache=cache).diarize_file(wav, count)
    assert wider.cached == ["speech"] and embedder.windows == len(first.subsegments) + len(wider.subsegments)
    # Another VAD setting, then a rewritten file: nothing reused.
    other_vad = Counting(EnergyVad(margin=0.4))
    assert Diarizer(embedder, other_vad, cache=cache).diarize_file(wav, count).cached == [] and other_vad.calls == 1
    write_wav(tmp_path / "three.wav", talk(*THREE)[0] * 0.5)
    assert Diarizer(embedder, vad, cache=cache).diarize_file(wav, count).cached == [] and vad.calls == 2


def test_speakerlab_diarize_cache_says_what_it_reused(capsys, tmp_path, ckpt):
    wav = write_wav(tmp_path / "three.wav", talk(*THREE)[0])
    common = [wav, "--checkpoint", ckpt, "--vad", "energy"]
    code, _, err = diarize(capsys, *common, "--cache", tmp_path / "c", "--rttm", tmp_path / "a.rttm")
    assert code == 0 and "from the cache" not in err
    code, _, err = diarize(
        capsys, *common, "--cache", tmp_path / "c", "--clustering", "ahc", "--rttm", tmp_path / "b.rttm"
    )
    assert code == 0 and "(speech and embeddings from the cache)" in err
    code, _, _ = diarize(capsys, *common, "--clustering", "ahc", "--rttm", tmp_path / "c.rttm")
    assert (tmp_path / "b.rttm").read_text() == (tmp_path / "c.rttm").read_text() != ""


class Weighted(torch.nn.Module):
    """`(B, T, F) -> (B, F)`: the mean log-mel over time, weighted per bin by its parameter."""

    def __init__(self, seed: int):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(80, generator=torch.Generator().manual_seed(seed)))

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        return feats.mean(dim=1) * self.w


def test_a_model_without_digest_rewritten_in_place_is_not_served_the_old_embeddings(tmp_path):
    """3D-Speaker weights, ReDimNet2 releases and int8 ONNX files have no digest (model_id ""): the cache keyed them
    by name alone, the file's path, so weights rewritten at that path got the embeddings of the old ones."""

    def released(seed: int) -> Embedder:  # one name, as `--3dspeaker campplus --weights w.pt` gives either weights
        return Embedder(Weighted(seed), FeatureSpec(FbankConfig(dither=0.0)), "cpu", "3dspeaker x from w.pt")

    wav = str(write_wav(tmp_path / "three.wav", talk(*THREE)[0]))
    cache, count = FrontCache(tmp_path / "cache"), SpeakerCount(1, 6)
    first = Diarizer(released(0), EnergyVad(), cache=cache).diarize_file(wav, count)
    assert first.cached == []
    other = Diarizer(released(1), EnergyVad(), cache=cache).diarize_file(wav, count)
    alone = Diarizer(released(1), EnergyVad()).diarize_file(wav, count)
    assert other.cached == ["speech"] and np.array_equal(other.embeddings, alone.embeddings)
    assert not np.allclose(other.embeddings, first.embeddings)
    again = Diarizer(released(0), EnergyVad(), cache=cache).diarize_file(wav, count)
    assert again.cached == ["speech", "embeddings"] and np.array_equal(again.embeddings, first.embeddings)
