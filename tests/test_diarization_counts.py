"""Speaker counts and determinism of diarization: exact / min / max counts honoured by spectral and VBx
clustering, with and without capping (`max_units`); one speaker found alone; a recording without speech
gives an empty RTTM and one line saying so; the same RTTM on three runs and on one or two threads of
torch (a checkpoint) and of onnxruntime (a waveform ONNX file)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from speakerlab.dataio.tables.rttm import read_rttm
from speakerlab.diarization.clustering.cluster import SpeakerCount, cluster
from speakerlab.diarization.clustering.plda import fit_plda
from tests.helpers import write_wav
from tests.test_deploy import stats_file  # noqa: F401 (the fixture)
from tests.test_diarization import SR, diarize, talk
from tests.test_diarization_scale import turns_of_speakers
from tests.test_vbx import plda, world  # noqa: F401 (the fixtures: a made-up embedder and its PLDA)

COUNTS = [
    SpeakerCount.exactly(1),
    SpeakerCount.exactly(2),
    SpeakerCount.exactly(7),
    SpeakerCount(5, 8),
    SpeakerCount(1, 3),
    SpeakerCount(2, 2),
]


@pytest.mark.parametrize("max_units", [0, 40])
@pytest.mark.parametrize("method", ["spectral", "vbx"])
@pytest.mark.parametrize("count", COUNTS, ids=lambda c: f"{c.min}-{c.max}")
def test_the_count_asked_for_is_honoured(world, plda, method, count, max_units):  # noqa: F811
    """A four-speaker conversation of 160 sub-segments: exact counts below, at and above four, a minimum above
    and a maximum below; capped (units of 4 neighbours) or not. Labels are 0..k-1 by first appearance."""
    x, _ = world.conversation(11, 4, 160)
    labels = cluster(x, count, method, plda=plda, max_units=max_units)
    k = len(np.unique(labels))
    assert count.min <= k <= count.max
    assert np.array_equal(np.unique(labels), np.arange(k)) and labels[0] == 0
    first = [int(np.flatnonzero(labels == j)[0]) for j in range(k)]
    assert first == sorted(first)


@pytest.mark.parametrize("method", ["spectral", "vbx"])
def test_an_exact_count_above_the_sub_segments_gives_each_its_own(world, plda, method):  # noqa: F811
    x, _ = world.conversation(12, 3, 6)
    assert cluster(x, SpeakerCount.exactly(9), method, plda=plda).tolist() == list(range(6))


def test_one_speaker_alone_is_found_by_either_method(world, plda):  # noqa: F811
    """Estimated between 1 and 10: a one-speaker conversation is one speaker, capped or not (spectral on
    embeddings whose cosine to their speaker is about 0.85; VBx on the PLDA's coordinates)."""
    x, who = turns_of_speakers(5, 2, 200)
    alone = x[who == 0]  # the first speaker's turns, one after another
    y, _ = world.conversation(13, 1, 150)
    for max_units in (0, 30):
        assert np.all(cluster(alone, SpeakerCount(1, 10), "spectral", max_units=max_units) == 0)
        assert np.all(cluster(y, SpeakerCount(1, 10), "vbx", plda=plda, max_units=max_units) == 0)


def test_no_speech_is_an_empty_rttm_and_one_line(capsys, tmp_path, ckpt):
    """Silence under VBx clustering: exit 0, the RTTM file written and empty, one warning line naming the file."""
    path = write_wav(tmp_path / "quiet.wav", np.zeros(4 * SR))
    g = np.random.default_rng(0)
    plda_file = tmp_path / "plda.npz"
    fit_plda(g.standard_normal((200, 16)), np.repeat(np.arange(10), 20)).save(plda_file)
    rttm = tmp_path / "out.rttm"
    code, out, err = diarize(
        capsys, path, "--checkpoint", ckpt, "--clustering", "vbx", "--plda", plda_file, "--rttm", rttm
    )
    assert code == 0 and out == "" and rttm.read_text() == ""
    assert [line for line in err.splitlines() if "no speech" in line] == [f"warning: {path}: no speech found: no turns"]


def same_rttm_runs(capsys, tmp_path, ckpt, stats_file, threads, systems):  # noqa: F811
    """Each of `systems` (checkpoint + spectral, checkpoint + VBx, ONNX + spectral) run once per entry of
    `threads` on a 10-second talk of three speakers (Silero VAD, the count estimated) -> {system: [RTTM texts]}."""
    before = torch.get_num_threads()
    path = write_wav(tmp_path / "talk.wav", talk(20, [0, 1, 2, 0, 1, 2], seconds=(1.0, 1.5))[0])
    g = np.random.default_rng(1)
    plda_file = tmp_path / "plda.npz"
    fit_plda(g.standard_normal((200, 16)), np.repeat(np.arange(10), 20)).save(plda_file)
    sources = {
        "torch": ["--checkpoint", ckpt],
        "torch-vbx": ["--checkpoint", ckpt, "--clustering", "vbx", "--plda", plda_file],
        "onnx": ["--onnx", stats_file],
    }
    texts: dict = {}
    try:
        for name in systems:
            for i, n in enumerate(threads):
                rttm = tmp_path / f"{name}{i}.rttm"
                code, _, err = diarize(capsys, path, *sources[name], "--threads", n, "--rttm", rttm)
                assert code == 0 and f"threads: {n}" in err and f"embeddings: {n} worker(s) of one thread" in err
                texts.setdefault(name, []).append(rttm.read_text())
            assert len(read_rttm(tmp_path / f"{name}0.rttm")["talk"]) > 1
    finally:
        torch.set_num_threads(before)
    return texts


def test_the_same_rttm_on_three_runs(capsys, tmp_path, ckpt, stats_file):  # noqa: F811
    """Torch (spectral: k-means; VBx) and onnxruntime: three runs, three identical RTTM files."""
    for name, texts in same_rttm_runs(
        capsys, tmp_path, ckpt, stats_file, (1, 1, 1), ("torch", "torch-vbx", "onnx")
    ).items():
        assert texts[0] != "" and texts.count(texts[0]) == 3, name


def test_the_same_rttm_on_one_or_two_threads(capsys, tmp_path, ckpt, stats_file):  # noqa: F811
    """`--threads` 1 and 2 give the same RTTM: 2 is two embedding workers of one thread each (speakerlab.inference.cli
    source_embedder), whose embeddings are those of one thread by construction (tests/test_extract.py)."""
    for name, texts in same_rttm_runs(capsys, tmp_path, ckpt, stats_file, (1, 2), ("torch", "onnx")).items():
        assert texts[0] != "" and texts[0] == texts[1], name
