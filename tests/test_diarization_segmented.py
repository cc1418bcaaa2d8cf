"""Diarization the segmentation way (speakerlab.diarization.segmented): a segmenter that hears the reference's local
speakers exactly stands in for the model, so what is tested is the pipeline: embeddings per (window, local speaker),
clustering, distinct clusters within a window, and frames with two speakers where two talk."""

from __future__ import annotations

import numpy as np
import pytest

from speakerlab.dataio.tables.rttm import Turn
from speakerlab.diarization import Diarizer
from speakerlab.diarization.pipeline import DiarizeOptions
from speakerlab.diarization.segmentation import HOP, KERNEL, STRIDE, SegmentationModel, frame_labels
from speakerlab.diarization.segmenter import window_layout
from tests.test_diarization import FOUR, THREE, spectral_shape_embedder, talk

SR = 16000


class OracleSegmenter:
    """The reference turns' local speakers per window (frame_labels: the three who talk most), laid out as
    OnnxSegmenter.sliding lays out its windows."""

    sample_rate, kernel, hop = SR, KERNEL, HOP * STRIDE

    def __init__(self, turns):
        self.turns = [(t.start, t.end, t.speaker) for t in turns]
        self.windows = 0

    def frame_centres(self, num_frames):
        return SegmentationModel.frame_centres(num_frames)

    def sliding(self, wave, window, step):
        size, stride, count = window_layout(len(wave), window, step, SR, self.kernel, self.hop)
        frames = SegmentationModel.num_frames(size)
        self.windows += count
        acts = [frame_labels(self.turns, frames, offset=w * stride / SR) for w in range(count)]
        return np.stack(acts), stride // self.hop


@pytest.fixture(scope="module")
def embedder():
    return spectral_shape_embedder()


def speakers_at(turns, t):
    return {turn.speaker for turn in turns if turn.start <= t < turn.end}


def mapping(ref, hyp, skip=(0.0, 0.0)):
    """Each reference speaker -> the hypothesis speakers found at the middles of its turns (0.25 s into a turn
    whose middle lies in `skip`)."""
    out = {}
    for t in ref:
        middle = (t.start + t.end) / 2
        at = t.start + 0.25 if skip[0] <= middle < skip[1] else middle
        out.setdefault(t.speaker, set()).update(speakers_at(hyp, at))
    return out


def overlapped(seed_order):
    """`talk` with speaker s1's first turn said again over the middle of s0's second: the wave, its reference
    turns (the overlap as a turn of s1) and the overlapped interval."""
    wave, ref = talk(*seed_order)
    src, dst = ref[1], ref[3]
    assert (src.speaker, dst.speaker) == ("s1", "s0") and dst.end - dst.start > 2.0
    a, b = int(src.start * SR), int(dst.start * SR + 8000)
    wave = wave.copy()
    wave[b : b + 24000] += wave[a : a + 24000]
    overlap = (b / SR, b / SR + 1.5)
    return wave, sorted([*ref, Turn(*overlap, "s1")], key=lambda t: t.start), overlap


def test_overlapped_frames_get_both_speakers_and_only_there(embedder):
    wave, ref, overlap = overlapped(THREE)
    result = Diarizer(embedder, segmenter=OracleSegmenter(ref)).diarize(wave, SR)
    who = mapping([t for t in ref if (t.start, t.end) != overlap], result.turns, overlap)
    assert all(len(v) == 1 for v in who.values()) and len(set.union(*who.values())) == 3, who
    assert speakers_at(result.turns, sum(overlap) / 2) == who["s0"] | who["s1"]
    times = np.arange(0, len(wave) / SR, 0.05)
    two = [t for t in times if len(speakers_at(result.turns, t)) >= 2]
    assert two and min(two) >= overlap[0] - 0.05 and max(two) <= overlap[1] + 0.05
    # Every embedding came from a (window, local speaker) and has its speaker; the centroids are unit length.
    assert len(result.labels) == len(result.embeddings) == len(result.subsegments) > 0
    assert set(result.labels.tolist()) <= {-1, 0, 1, 2} and np.allclose(np.linalg.norm(result.centroids, axis=1), 1)
    assert sorted(result.seconds) == ["clustering", "embeddings", "speech"]


def test_more_speakers_than_a_window_holds_are_all_found(embedder):
    # Ten-second windows over four speakers taking 2-4 s turns: most windows hear four, the model's K is 3.
    wave, ref = talk(*FOUR)
    segmenter = OracleSegmenter(ref)
    options = DiarizeOptions(seg_window=10.0, seg_step=2.0)
    labels = [frame_labels(segmenter.turns, 10, offset=s) for s in np.arange(0, len(wave) / SR - 10, 2.0)]
    heard = {len({t.speaker for t in ref if t.start < s + 10 and t.end > s}) for s in np.arange(0, 30, 2.0)}
    assert max(heard) == 4 and all(x.shape == (10, 3) for x in labels)
    result = Diarizer(embedder, segmenter=segmenter, options=options).diarize(wave, SR)
    who = mapping(ref, result.turns)
    assert all(len(v) == 1 for v in who.values()) and len(set.union(*who.values())) == 4, who


@pytest.mark.parametrize("method", ["spectral", "ahc", "vbx"])
def test_the_count_asked_for_is_honoured(embedder, method):
    """Exact, minimum and maximum counts through the segmentation way: three speakers read as the count asked for
    (a count above three makes clusters of one person's pieces; each still gets turns, none is dropped)."""
    from speakerlab.diarization.clustering.cluster import SpeakerCount
    from speakerlab.diarization.clustering.plda import fit_plda

    wave, ref = talk(*THREE)
    g = np.random.default_rng(0)
    plda = fit_plda(g.standard_normal((400, 80)), np.repeat(np.arange(20), 20)) if method == "vbx" else None
    diarizer = Diarizer(embedder, options=DiarizeOptions(method=method), plda=plda, segmenter=OracleSegmenter(ref))
    for low, high in ((6, 6), (5, 10), (3, 3), (1, 2), (2, 2)):
        result = diarizer.diarize(wave, SR, SpeakerCount(low, high))
        found = {t.speaker for t in result.turns}
        assert low <= len(found) <= high and result.notes == [], (low, high, len(found))


def test_one_speaker_is_one_speaker(embedder):
    wave, ref = talk(2, [0] * 6)
    result = Diarizer(embedder, segmenter=OracleSegmenter(ref)).diarize(wave, SR)
    assert {t.speaker for t in result.turns} == {"spk00"}
    # The turns cover the reference speech to within a frame at each end.
    for t in ref:
        assert speakers_at(result.turns, t.start + 0.03) == speakers_at(result.turns, t.end - 0.03) == {"spk00"}


def test_no_speech_gives_no_turns_and_says_so(embedder):
    wave = 1e-4 * np.random.default_rng(0).standard_normal(8 * SR).astype(np.float32)
    segmenter = OracleSegmenter([])
    result = Diarizer(embedder, segmenter=segmenter).diarize(wave, SR, name="quiet")
    assert result.turns == [] and result.speech == [] and segmenter.windows == 4  # 5 s windows every 1 s over 8 s
    assert result.notes == ["quiet: no speech found: no turns"]


def test_window_layout_reaches_the_end_in_whole_frames():
    assert window_layout(5 * SR, 5.0, 2.5, SR, 400, 320) == (80000, 40000, 1)
    size, stride, count = window_layout(5 * SR + 1, 5.0, 1.01, SR, 400, 320)
    assert stride % 320 == 0 and stride == 16000 and count == 2 and (count - 1) * stride + size >= 5 * SR + 1
    assert window_layout(100, 5.0, 2.5, SR, 400, 320)[2] == 1


def test_segmentation_systems_share_the_windows_and_embeddings_through_the_cache(embedder, tmp_path):
    """Three systems on one recording, as a recipe runs them (spectral, VBx-less AHC, the count given): the
    segmenter and the embedder run for the first alone, and each later one gets the turns it gets without the
    cache; another segmentation model or window layout runs the segmenter again (and the embedder for spans it
    has not embedded)."""
    from speakerlab.diarization import SpeakerCount
    from speakerlab.diarization.cache import FrontCache
    from tests.helpers import write_wav
    from tests.test_diarization_cache import Counting

    wave, ref, _ = overlapped(THREE)
    wav = str(write_wav(tmp_path / "talk.wav", wave))
    segmenter, counting = OracleSegmenter(ref), Counting(embedder)
    segmenter.model_id = "oracle-a"
    cache = FrontCache(tmp_path / "cache")
    first = Diarizer(counting, segmenter=segmenter, cache=cache).diarize_file(wav)
    windows, embedded = segmenter.windows, counting.windows
    assert first.cached == [] and windows > 0 and embedded == len(first.embeddings) > 0
    for options, count in ((DiarizeOptions(method="ahc"), None), (DiarizeOptions(), SpeakerCount(3, 3))):
        again = Diarizer(counting, segmenter=segmenter, options=options, cache=cache).diarize_file(wav, count)
        alone = Diarizer(embedder, segmenter=OracleSegmenter(ref), options=options).diarize_file(wav, count)
        assert again.cached == ["speech", "embeddings"] and (segmenter.windows, counting.windows) == (windows, embedded)
        assert again.turns == alone.turns and np.array_equal(again.embeddings, alone.embeddings)
    # Another model file: segmented again; it finds the same spans (this oracle), whose embeddings are reused.
    segmenter.model_id = "oracle-b"
    assert Diarizer(counting, segmenter=segmenter, cache=cache).diarize_file(wav).cached == ["embeddings"]
    assert segmenter.windows == 2 * windows and counting.windows == embedded
    other = Diarizer(counting, segmenter=segmenter, options=DiarizeOptions(seg_step=2.0), cache=cache)
    assert other.diarize_file(wav).cached == [] and segmenter.windows > 2 * windows and counting.windows > embedded
