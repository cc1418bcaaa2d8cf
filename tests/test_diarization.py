"""speakerlab.diarization: known turns found within a collar, the speaker count options honoured, the same
output for the same input, two threads at once as one alone, and the bad-input catalogue of
docs/diarization.md, through the Python API and `speakerlab-diarize`.

The behaviour tests embed with a model that needs no training: the mean log-mel spectrum less its mean
over bins (a speaker's spectral shape). On conversations of synthetic voices with one recording session
per speaker it tells the speakers apart, so what is tested is the pipeline, not a trained model (that is
the slow recipe test, tests/test_diarization_data.py)."""

from __future__ import annotations

import json
import re
import threading

import numpy as np
import pytest
import torch

from speakerlab.dataio.tables.rttm import Turn, read_rttm
from speakerlab.diarization import DiarizeOptions, Diarizer, SpeakerCount, make_vad
from speakerlab.diarization.cli import run
from speakerlab.diarization.clustering.cluster import cluster
from speakerlab.diarization.der import der
from speakerlab.frontends import FbankConfig, FeatureSpec
from speakerlab.inference.embedder import Embedder
from speakerlab.sources import read_source
from speakerlab.synth.conversations import trim
from speakerlab.synth.spectra import SR
from speakerlab.synth.voice import draw_session, draw_speaker, synth_utterance
from tests.helpers import assert_no_traceback, write_wav


class SpectralShape(torch.nn.Module):
    """`(B, T, F) -> (B, F)`: mean log-mel over time, less its mean over bins (the level)."""

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        m = feats.mean(dim=1)
        return m - m.mean(dim=1, keepdim=True)


def talk(seed: int, order, seconds=(2.0, 4.0)):
    """Speakers taking the turns of `order` (speaker indices), 0.6-1.2 s apart, one session each ->
    (wave (N,) float32 at 16 kHz, reference turns: each utterance less its leading/trailing silence)."""
    g = np.random.default_rng(seed)
    voices = [draw_speaker(np.random.default_rng([seed, 1, i])) for i in range(max(order) + 1)]
    sessions = [draw_session(np.random.default_rng([seed, 2, i]), snr_range=(30, 40)) for i in range(len(voices))]
    parts, ref, n = [], [], 0
    for k in order:
        gap = int(g.uniform(0.6, 1.2) * SR)
        x = synth_utterance(voices[k], int(g.uniform(*seconds) * SR), g, sessions[k])
        a, b = trim(x)
        ref.append(Turn((n + gap + a) / SR, (n + gap + b) / SR, f"s{k}"))
        parts += [np.zeros(gap, np.float32), x]
        n += gap + len(x)
    wave = np.concatenate([*parts, np.zeros(SR // 2, np.float32)])
    return wave + 1e-4 * g.standard_normal(len(wave)).astype(np.float32), ref


THREE = (0, [0, 1, 2, 0, 1, 2, 1, 0, 2, 0])
FOUR = (1, [0, 1, 0, 1, 2, 3, 2, 3, 0, 2, 1, 3])


def spectral_shape_embedder() -> Embedder:
    return Embedder(SpectralShape(), FeatureSpec(FbankConfig(dither=0.0), mean_norm=False), "cpu", "spectral shape")


@pytest.fixture(scope="session")
def shape_embedder():
    return spectral_shape_embedder()


@pytest.fixture(scope="session")
def talks(tmp_path_factory):
    """{name: (wav path, wave, reference turns)}: three speakers, four speakers, one speaker."""
    root = tmp_path_factory.mktemp("talks")
    out = {}
    for name, (seed, order) in {"three": THREE, "four": FOUR, "one": (2, [0] * 8)}.items():
        wave, ref = talk(seed, order)
        out[name] = (str(write_wav(root / f"{name}.wav", wave)), wave, ref)
    return out


@pytest.mark.parametrize("vad", ["energy", "silero"])
@pytest.mark.parametrize("name", ["three", "four"])
def test_known_turns_are_found_within_the_collar(shape_embedder, talks, vad, name):
    _, wave, ref = talks[name]
    result = Diarizer(shape_embedder, make_vad(vad)).diarize(wave, SR)
    assert len(result.speakers) == len({t.speaker for t in ref})
    score = der({"a": ref}, {"a": result.turns}, collar=0.25)
    # Measured: 0.1-3.4 % of the speech, all of it at turn edges (false alarm from the VADs' padding);
    # no confusion.
    assert score["confusion"] == 0.0 and score["der"] < 0.05, score
    assert result.embeddings.shape == (len(result.subsegments), 80) and result.centroids.shape == (
        len(result.speakers),
        80,
    )


def test_one_speaker_alone_is_one_speaker(shape_embedder, talks):
    _, wave, ref = talks["one"]
    for method in ("spectral", "ahc"):
        result = Diarizer(shape_embedder, make_vad("energy"), DiarizeOptions(method=method)).diarize(wave, SR)
        assert result.speakers == ["spk00"] and len(result.turns) == len(ref)


@pytest.mark.parametrize("method", ["spectral", "ahc"])
def test_the_speaker_count_options_are_honoured(shape_embedder, talks, method):
    _, wave, _ = talks["three"]
    emb = Diarizer(shape_embedder, make_vad("energy")).diarize(wave, SR).embeddings  # 3 speakers' sub-segments
    for n in (1, 2, 4, 5):
        labels = cluster(emb, SpeakerCount.exactly(n), method)
        assert sorted(set(labels)) == list(range(n)) and labels[0] == 0
    assert len(set(cluster(emb, SpeakerCount(min=5, max=8), method))) >= 5
    assert len(set(cluster(emb, SpeakerCount(max=2), method))) <= 2
    assert len(set(cluster(emb, SpeakerCount.exactly(len(emb) + 3), method))) == len(emb)  # each its own


def test_the_same_input_gives_the_same_output(shape_embedder, talks):
    _, wave, _ = talks["four"]
    diarizer = Diarizer(shape_embedder, make_vad("silero"), DiarizeOptions(seed=3))
    a, b = diarizer.diarize(wave, SR), diarizer.diarize(wave.copy(), SR)
    assert a.turns == b.turns and np.array_equal(a.embeddings, b.embeddings)


def test_two_threads_at_once_give_what_each_gives_alone(shape_embedder, talks):
    diarizer = Diarizer(shape_embedder, make_vad("silero"))
    names = ["three", "four", "four", "three"]  # worker 0: three, four; worker 1: four, three
    alone = {n: diarizer.diarize(talks[n][1], SR) for n in set(names)}
    results = {}
    barrier = threading.Barrier(2)

    def work(worker):
        barrier.wait()  # both start together, so their calls interleave
        results[worker] = [diarizer.diarize(talks[n][1], SR) for n in names[worker::2]]

    threads = [threading.Thread(target=work, args=(w,)) for w in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for worker in (0, 1):
        for n, got in zip(names[worker::2], results[worker]):
            assert got.turns == alone[n].turns and np.array_equal(got.embeddings, alone[n].embeddings)


def test_oracle_speech_is_used_as_given(shape_embedder, talks):
    _, wave, ref = talks["three"]
    result = Diarizer(shape_embedder).diarize(wave, SR, speech=[(t.start, t.end) for t in ref])
    assert result.speech == [(t.start, t.end) for t in ref]
    assert der({"a": ref}, {"a": result.turns}, collar=0.0)["der"] == pytest.approx(0.0, abs=1e-9)


# ---------------------------------------------------------------- speakerlab-diarize


def diarize(capsys, *args):
    code = run([*map(str, args)])
    out, err = capsys.readouterr()
    assert_no_traceback(out, err)
    return code, out, err


def test_cli_writes_rttm_and_json_and_is_deterministic(capsys, tmp_path, talks, ckpt):
    scp = tmp_path / "wav.scp"
    scp.write_text(f"three {talks['three'][0]}\nfour {talks['four'][0]}\n")
    common = ["--wav-scp", scp, "--checkpoint", ckpt, "--vad", "energy", "--num-speakers", 3]
    code, _, err = diarize(
        capsys, *common, "--rttm", tmp_path / "a.rttm", "--json", tmp_path / "a.json", "--embeddings"
    )
    assert code == 0 and "s per hour" in err
    # Each recording's line gives the wall time of each stage.
    assert len(re.findall(r"\(speech [\d.]+ s, embeddings [\d.]+ s, clustering [\d.]+ s\)", err)) == 2, err
    code, _, _ = diarize(capsys, *common, "--rttm", tmp_path / "b.rttm")
    assert code == 0 and (tmp_path / "a.rttm").read_bytes() == (tmp_path / "b.rttm").read_bytes()
    turns = read_rttm(tmp_path / "a.rttm")
    assert sorted(turns) == ["four", "three"] and all(len({t.speaker for t in ts}) == 3 for ts in turns.values())
    whole = json.loads((tmp_path / "a.json").read_text())
    assert whole["model_id"] == read_source(ckpt).digest != ""  # the checkpoint's content digest
    doc = whole["recordings"]
    assert [r["id"] for r in doc] == ["three", "four"]
    assert len(doc[0]["centroids"]) == 3 and len(doc[0]["centroids"]["spk00"]) == 16
    assert {s["speaker"] for s in doc[0]["subsegments"]} == set(doc[0]["speakers"])
    assert len(doc[0]["turns"]) == len(turns["three"])


@pytest.mark.slow
def test_cli_diarizes_with_a_waveform_onnx_file_as_with_its_checkpoint(capsys, tmp_path, talks, ckpt):
    """--onnx (speakerlab-export --waveform of the checkpoint, run by onnxruntime): the RTTM of --checkpoint."""
    from speakerlab.inference.deploy.export import main as export

    pytest.importorskip("onnxruntime")
    onnx_file = tmp_path / "m.onnx"
    assert export(["--checkpoint", str(ckpt), "--format", "onnx", "--waveform", "--out", str(onnx_file)]) == 0
    common = [talks["three"][0], "--vad", "energy", "--num-speakers", 3]
    code, _, _ = diarize(capsys, *common, "--checkpoint", ckpt, "--rttm", tmp_path / "torch.rttm")
    assert code == 0
    code, _, err = diarize(capsys, *common, "--onnx", onnx_file, "--rttm", tmp_path / "onnx.rttm")
    assert code == 0 and f"campplus ({onnx_file})" in err
    assert (tmp_path / "onnx.rttm").read_text() == (tmp_path / "torch.rttm").read_text() != ""


def test_cli_takes_each_recordings_count_and_oracle_speech(capsys, tmp_path, talks, ckpt):
    counts, ref = tmp_path / "reco2num_spk", tmp_path / "ref.rttm"
    counts.write_text("three 2\n")
    ref.write_text(
        "".join(
            f"SPEAKER three 1 {t.start:.3f} {t.end - t.start:.3f} <NA> <NA> {t.speaker} <NA> <NA>\n"
            for t in talks["three"][2]
        )
    )
    code, out, _ = diarize(
        capsys, talks["three"][0], "--checkpoint", ckpt, "--reco2num-spk", counts, "--vad", "oracle", "--segments", ref
    )
    turns = [line.split() for line in out.splitlines()]
    assert code == 0 and len({t[7] for t in turns}) == 2
    for t in turns:  # every turn within the given speech
        start, end = float(t[3]), float(t[3]) + float(t[4])
        assert any(r.start - 1e-3 <= start and end <= r.end + 1e-3 for r in talks["three"][2])


# ---------------------------------------------------------------- the bad-input catalogue (docs/diarization.md)


def test_silence_only_gives_no_turns_and_says_so(capsys, tmp_path, ckpt):
    path = write_wav(tmp_path / "quiet.wav", np.zeros(5 * SR))
    for vad in ("energy", "silero"):
        code, out, err = diarize(capsys, path, "--checkpoint", ckpt, "--vad", vad)
        assert code == 0 and out == "" and f"warning: {path}: no speech found: no turns" in err


def test_half_a_second_of_speech_is_one_turn_of_one_speaker(capsys, tmp_path, ckpt):
    g = np.random.default_rng(5)
    x = synth_utterance(draw_speaker(g), SR // 2, g)
    path = write_wav(tmp_path / "short.wav", x)
    code, out, _ = diarize(capsys, path, "--checkpoint", ckpt, "--vad", "energy", "--num-speakers", 2)
    lines = [line.split() for line in out.splitlines()]
    assert code == 0 and len(lines) == 1 and lines[0][7] == "spk00" and float(lines[0][4]) <= 0.5


def test_a_stereo_file_is_diarized_on_its_first_channel(capsys, tmp_path, talks, ckpt):
    _, wave, _ = talks["three"]
    mono = write_wav(tmp_path / "mono.wav", wave)
    stereo = write_wav(tmp_path / "stereo.wav", np.stack([wave, np.zeros_like(wave)], axis=1))
    _, want, _ = diarize(capsys, mono, "--checkpoint", ckpt, "--vad", "energy")
    code, out, err = diarize(capsys, stereo, "--checkpoint", ckpt, "--vad", "energy")
    assert code == 0 and f"{stereo}: 2 channels, using the first" in err
    assert out == want.replace("mono", "stereo")


def test_a_file_that_is_not_audio_is_one_error_line(capsys, tmp_path, ckpt):
    path = tmp_path / "notes.wav"
    path.write_text("not audio at all\n")
    code, out, err = diarize(capsys, path, "--checkpoint", ckpt, "--vad", "energy", "--rttm", tmp_path / "out.rttm")
    assert code == 2 and err.startswith(f"error: {path}: cannot read audio") and len(err.splitlines()) == 1
    assert not (tmp_path / "out.rttm").exists()


def test_more_speakers_than_the_speech_supports_is_a_warning_and_the_most_it_can(capsys, tmp_path, ckpt):
    g = np.random.default_rng(6)
    x = np.concatenate([np.zeros(SR), synth_utterance(draw_speaker(g), 2 * SR, g), np.zeros(SR)])
    path = write_wav(tmp_path / "two_s.wav", x)
    code, out, err = diarize(capsys, path, "--checkpoint", ckpt, "--vad", "energy", "--num-speakers", 9)
    pieces = int(err.split("gives only ")[1].split()[0])
    assert code == 0 and "9 speakers asked for, but the speech gives only" in err
    assert 1 < len({line.split()[7] for line in out.splitlines()}) <= pieces < 9


@pytest.mark.parametrize(
    "args, message",
    [
        (["--vad", "oracle"], "--vad oracle and --segments go together"),
        (["--num-speakers", "0"], "--num-speakers must be >= 1"),
        (["--min-speakers", "3", "--max-speakers", "2"], "need 1 <= --min-speakers <= --max-speakers"),
        (["--num-speakers", "2", "--reco2num-spk", "x"], "--num-speakers and --reco2num-spk exclude each other"),
        (["--clustering", "vbx"], "--clustering vbx and --plda go together"),
        (["--segmentation", "m.onnx", "--vad", "oracle", "--segments", "x"], "--segmentation finds the speech"),
    ],
)
def test_option_errors_name_the_option(capsys, tmp_path, ckpt, args, message):
    path = write_wav(tmp_path / "a.wav", np.zeros(SR))
    with pytest.raises(SystemExit) as e:
        run([str(path), "--checkpoint", str(ckpt), *args])
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_a_missing_or_unreadable_segmentation_model_is_one_line(capsys, tmp_path, ckpt):
    path = write_wav(tmp_path / "a.wav", np.zeros(SR))
    code, _, err = diarize(capsys, path, "--checkpoint", ckpt, "--segmentation", tmp_path / "none.onnx")
    assert code == 2 and f"{tmp_path / 'none.onnx'}: no such file" in err
    (tmp_path / "text.onnx").write_text("not a model\n")
    code, _, err = diarize(capsys, path, "--checkpoint", ckpt, "--segmentation", tmp_path / "text.onnx")
    assert code == 2 and len(err.splitlines()) == 1
    assert err.startswith(f"error: {tmp_path / 'text.onnx'}: not an ONNX model onnxruntime can load (")


def test_a_recording_missing_from_reco2num_spk_is_named(capsys, tmp_path, talks, ckpt):
    counts = tmp_path / "reco2num_spk"
    counts.write_text("other 2\n")
    code, _, err = diarize(capsys, talks["one"][0], "--checkpoint", ckpt, "--reco2num-spk", counts)
    assert code == 2 and err == f"error: {counts}: no speaker count for 'one' (1 recording(s))\n"


def test_the_options_are_checked():
    with pytest.raises(ValueError, match="need 0 < hop <= window"):
        DiarizeOptions(window=1.0, hop=2.0)
    with pytest.raises(ValueError, match="min <= max"):
        SpeakerCount(3, 2)
