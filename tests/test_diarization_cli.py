"""`speakerlab-diarize` and `speakerlab-der` as a new user meets them: both run where torch cannot be imported
(`--onnx`, the Silero VAD, an 8 kHz file resampled), every file of a wav.scp checked before work, a failing
recording keeping the finished ones, contradicting speaker counts refused in one line; and the Silero decision
rule written out in speakerlab.diarization.vad giving the package's own regions.

The ONNX embedder is tests/test_deploy.py's small waveform graph (per row: mean and mean square of the samples):
what is tested is that the commands run and what they write, not who spoke when (tests/test_diarization.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from speakerlab.dataio.tables.rttm import read_rttm
from speakerlab.diarization.cli import run
from speakerlab.diarization.pipeline import embed_window
from speakerlab.inference.common import too_short
from speakerlab.inference.deploy.runtime import OnnxEmbedder
from tests.helpers import write_wav
from tests.stats_onnx import MIN_SAMPLES, stats
from tests.test_deploy import stats_file, torch_free_env  # noqa: F401 (stats_file: the fixture)
from tests.test_diarization import talk

SR = 16000


@pytest.fixture(scope="module")
def conversations(tmp_path_factory):
    """A wav.scp of two short conversations, the second at 8 kHz (resampled on the way in)."""
    root = tmp_path_factory.mktemp("conv")
    lines = []
    for i, rate in enumerate((SR, 8000)):
        wave, _ = talk(10 + i, [0, 1, 0, 1], seconds=(1.0, 1.5))
        wave = wave if rate == SR else wave[::2]  # 8 kHz: the talk's band is well below 4 kHz
        lines.append(f"c{i} {write_wav(root / f'c{i}.wav', wave, rate)}\n")
    (root / "wav.scp").write_text("".join(lines))
    return root / "wav.scp"


@pytest.mark.slow  # three fresh interpreters importing onnxruntime, scipy, sklearn, pandas: ~50 s at load 15
def test_diarize_onnx_and_der_run_where_torch_cannot_be_imported(stats_file, conversations, tmp_path):  # noqa: F811
    env = torch_free_env(tmp_path)
    assert subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True).returncode != 0
    rttm, out_json = tmp_path / "hyp.rttm", tmp_path / "hyp.json"
    script = (
        "import sys; from speakerlab.diarization.cli import run; code = run(sys.argv[1:]); "
        "print('torch loaded' if 'torch' in sys.modules else 'no torch'); sys.exit(code)"
    )
    args = ["--wav-scp", conversations, "--onnx", stats_file, "--vad", "silero", "--num-speakers", "2"]
    cmd = [sys.executable, "-c", script, *map(str, args), "--rttm", str(rttm), "--json", str(out_json)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "no torch" and "Traceback" not in done.stderr
    hyp = read_rttm(rttm)
    assert set(hyp) == {"c0", "c1"} and all(len({t.speaker for t in turns}) == 2 for turns in hyp.values())
    # The 8 kHz file's turns lie where its 16 kHz twin's would: speech found after resampling.
    assert max(t.end for t in hyp["c1"]) > 4.0 and out_json.stat().st_size > 0

    # The segmentation way too: a small random segmentation model's ONNX file (written here, with torch) in place
    # of the VAD; with the count asked for, two speakers in each recording.
    import torch

    from speakerlab.diarization.segmentation import SegmentationModel, SegmentationShape, export_onnx

    torch.manual_seed(0)
    shape = SegmentationShape(filters=16, channels=16, hidden=16, layers=1, frontend="fbank", dropout=0.0)
    export_onnx(SegmentationModel(shape).eval(), tmp_path / "seg.onnx")
    args = ["--wav-scp", conversations, "--onnx", stats_file, "--segmentation", tmp_path / "seg.onnx"]
    cmd = [sys.executable, "-c", script, *map(str, args), "--num-speakers", "2", "--rttm", str(rttm)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "no torch" and "Traceback" not in done.stderr
    hyp = read_rttm(rttm)
    assert set(hyp) == {"c0", "c1"} and all(len({t.speaker for t in turns}) == 2 for turns in hyp.values())

    der = "import sys; from speakerlab.diarization.der import main; sys.exit(main(sys.argv[1:]))"
    helped = subprocess.run([sys.executable, "-c", der, "--help"], env=env, capture_output=True, text=True)
    assert helped.returncode == 0 and "--hyp" in helped.stdout, helped.stderr
    scored = subprocess.run(
        [sys.executable, "-c", der, "--ref", str(rttm), "--hyp", f"self={rttm}"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert scored.returncode == 0, scored.stderr
    assert scored.stdout.splitlines()[1].split()[3] == "0.00"  # a system against itself: DER 0


def diarize(capsys, *args) -> tuple:
    code = run([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_missing_file_is_found_before_any_work(stats_file, conversations, tmp_path, capsys):  # noqa: F811
    first = conversations.read_text().splitlines()[0]
    gone = tmp_path / "gone.wav"
    scp = tmp_path / "wav.scp"
    scp.write_text(f"{first}\nc9 {gone}\n")
    rttm = tmp_path / "hyp.rttm"
    code, _, err = diarize(capsys, "--wav-scp", scp, "--onnx", stats_file, "--vad", "energy", "--rttm", rttm)
    assert code == 2 and err == f"error: no such file: {gone} ({scp} line 2)\n"
    assert not rttm.exists()  # checked up front: nothing diarized, nothing written


def test_a_recording_that_fails_keeps_the_ones_before_it(stats_file, conversations, tmp_path, capsys):  # noqa: F811
    """The second recording's samples are NaN (a float WAV): its embeddings are not finite, an error naming it;
    the first recording's RTTM and JSON are written."""
    first = conversations.read_text().splitlines()[0]
    bad = write_wav(tmp_path / "nan.wav", np.full(3 * SR, np.nan, np.float32), SR, subtype="FLOAT")
    scp = tmp_path / "wav.scp"
    scp.write_text(f"{first}\nc9 {bad}\n")
    segments = tmp_path / "speech.rttm"  # oracle speech: the NaN file has some, so it gets embedded
    segments.write_text("".join(f"SPEAKER {r} 1 0.5 2.0 <NA> <NA> a <NA> <NA>\n" for r in ("c0", "c9")))
    rttm, out_json = tmp_path / "hyp.rttm", tmp_path / "hyp.json"
    opts = ("--vad", "oracle", "--segments", segments, "--rttm", rttm, "--json", out_json)
    code, _, err = diarize(capsys, "--wav-scp", scp, "--onnx", stats_file, *opts)
    assert code == 2 and "error:" in err and str(bad) in err.splitlines()[-1]
    assert "1 of 2 recording(s) done and written" in err
    assert set(read_rttm(rttm)) == {"c0"} and '"id": "c0"' in out_json.read_text()


@pytest.mark.parametrize(
    "counts,message",
    [
        (
            ("--num-speakers", "2", "--min-speakers", "3"),
            "--num-speakers 2 contradicts --min-speakers 3 / --max-speakers 20",
        ),
        (
            ("--num-speakers", "5", "--max-speakers", "4"),
            "--num-speakers 5 contradicts --min-speakers 1 / --max-speakers 4",
        ),
        (("--min-speakers", "4", "--max-speakers", "3"), "need 1 <= --min-speakers <= --max-speakers, got 4, 3"),
        # 0 is a count, not "unset": it once fell back to the default range without a word
        (
            (
                "--max-speakers",
                "0",
            ),
            "need 1 <= --min-speakers <= --max-speakers, got 1, 0",
        ),
        (
            (
                "--min-speakers",
                "0",
            ),
            "need 1 <= --min-speakers <= --max-speakers, got 0, 20",
        ),
    ],
)
def test_contradicting_speaker_counts_are_one_error_line(stats_file, conversations, capsys, counts, message):  # noqa: F811
    with pytest.raises(SystemExit) as stop:
        run(["--wav-scp", str(conversations), "--onnx", str(stats_file), *counts])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.splitlines()[-1].endswith(message)


def test_silero_decision_rule_gives_the_packages_regions():
    """hysteresis_regions on our own onnxruntime probabilities against silero-vad's get_speech_timestamps_sequence
    (which imports torch, as this test may), for the default options and for looser ones."""
    silero = pytest.importorskip("silero_vad")
    from speakerlab.diarization.vad import SileroVad

    model = silero.load_silero_vad(sequence=True)
    found = 0
    for seed in range(3):
        # Short turns: some below min_speech; seed 2 (35 s) spans three of our onnxruntime blocks of 16.4 s.
        wave, _ = talk(seed, [0, 1, 2, 0, 1] * (1 + 2 * (seed == 2)), seconds=(0.2, 2.5))
        for threshold, min_speech, min_silence, pad in ((0.5, 0.25, 0.1, 0.03), (0.3, 0.5, 0.5, 0.3)):
            theirs = silero.get_speech_timestamps_sequence(
                wave,
                model,
                sampling_rate=SR,
                threshold=threshold,
                min_speech_duration_ms=int(min_speech * 1000),
                min_silence_duration_ms=int(min_silence * 1000),
                speech_pad_ms=int(pad * 1000),
            )
            ours = SileroVad(threshold, min_speech, min_silence, pad)(wave)
            assert ours == [(s["start"] / SR, s["end"] / SR) for s in theirs]
            found += len(ours)
    assert found > 20  # speech was found: the comparison was not of empty lists


def test_a_recording_below_the_shortest_input_is_one_line_and_keeps_the_ones_before(
    stats_file,  # noqa: F811
    conversations,
    tmp_path,
    capsys,
):
    """A recording one sample below the model's shortest input (its min_samples) is refused with the one line
    every command gives, named by its wav.scp line; the recording before it is written."""
    first = conversations.read_text().splitlines()[0]
    short = write_wav(tmp_path / "short.wav", 0.1 * np.ones(MIN_SAMPLES - 1, np.float32), SR)
    scp, rttm = tmp_path / "wav.scp", tmp_path / "hyp.rttm"
    scp.write_text(f"{first}\nc9 {short}\n")
    code, _, err = diarize(capsys, "--wav-scp", scp, "--onnx", stats_file, "--vad", "energy", "--rttm", rttm)
    line = too_short(MIN_SAMPLES - 1, OnnxEmbedder(str(stats_file)))
    assert code == 2 and err.splitlines()[-1] == f"error: {scp}:2: c9: {short}: {line}"
    assert set(read_rttm(rttm)) == {"c0"}


def test_a_recording_shorter_than_a_window_is_padded_by_repetition(stats_file, tmp_path, capsys):  # noqa: F811
    """A 0.3 s recording (above the shortest input, below the 0.5 s min_embed window): its one sub-segment is
    embedded from the recording repeated to 0.5 s (the stats model's mean square would drop by 40 % with
    zeros instead)."""
    rng = np.random.default_rng(4)
    wave = (0.2 + 0.1 * rng.standard_normal(int(0.3 * SR))).astype(np.float32)
    path = write_wav(tmp_path / "r.wav", wave, SR, subtype="FLOAT")
    segments, out_json = tmp_path / "speech.rttm", tmp_path / "hyp.json"
    segments.write_text("SPEAKER r 1 0.0 0.3 <NA> <NA> a <NA> <NA>\n")
    opts = ("--vad", "oracle", "--segments", segments, "--json", out_json, "--embeddings", "--num-speakers", "1")
    code, out, _ = diarize(capsys, path, "--onnx", stats_file, *opts)
    assert code == 0 and out.split()[3:5] == ["0.000", "0.300"]
    [sub] = json.loads(out_json.read_text())["recordings"][0]["subsegments"]
    np.testing.assert_allclose(sub["embedding"], stats(np.resize(wave, SR // 2)), rtol=1e-5)
    assert abs(stats(np.resize(wave, SR // 2))[1] - stats(np.concatenate([wave, np.zeros(SR // 5)]))[1]) > 0.01


def test_a_window_below_the_shortest_input_is_widened_to_it():
    """min_embed below the model's shortest input: the window is widened about its centre to that input."""
    wave = np.arange(SR, dtype=np.float32)
    piece = embed_window(wave, SR, 0.5, 0.51, 0.02, min_samples=MIN_SAMPLES)
    assert len(piece) == MIN_SAMPLES and piece[0] == int(0.505 * SR) - MIN_SAMPLES // 2
    assert len(embed_window(wave, SR, 0.5, 0.51, 0.02)) == int(0.02 * SR)


@pytest.mark.parametrize(
    "option, message",
    [
        (("--threshold", "-1"), "error: threshold must lie in (0, 2), got -1.0"),
        (("--merge-cosine", "3"), "error: merge_cosine must lie in [-1, 1] (1: never merge), got 3.0"),
        (("--cache", "{scp}"), "error: {scp} is a file, not a folder: this command writes a folder of files there"),
    ],
)
def test_settings_out_of_range_are_one_line_before_any_work(
    stats_file,  # noqa: F811
    conversations,
    capsys,
    tmp_path,
    option,
    message,
):
    rttm = tmp_path / "hyp.rttm"
    option = tuple(o.format(scp=conversations) for o in option)
    code = run(["--wav-scp", str(conversations), "--onnx", str(stats_file), "--rttm", str(rttm), *option])
    err = capsys.readouterr().err
    assert code == 2 and err == message.format(scp=conversations) + "\n", err
    assert not rttm.exists()


def test_an_empty_wav_scp_is_one_line(stats_file, tmp_path, capsys):  # noqa: F811
    empty = tmp_path / "wav.scp"
    empty.write_text("")
    assert run(["--wav-scp", str(empty), "--onnx", str(stats_file), "--rttm", str(tmp_path / "h.rttm")]) == 2
    assert capsys.readouterr().err == f"error: {empty}: no recordings in it (an empty wav.scp)\n"


def test_a_reco2num_spk_count_outside_the_range_is_one_line(stats_file, conversations, tmp_path, capsys):  # noqa: F811
    """The recipes give --max-speakers to every system, --reco2num-spk too: a count beyond it was honoured without a
    word (5 speakers under --max-speakers 3), where --num-speakers 5 is refused."""
    counts = tmp_path / "reco2num_spk"
    counts.write_text("c0 2\nc1 5\n")
    rttm = tmp_path / "h.rttm"
    args = ["--wav-scp", conversations, "--onnx", stats_file, "--reco2num-spk", counts, "--rttm", rttm]
    code, _, err = diarize(capsys, *args, "--max-speakers", 3)
    assert code == 2 and not rttm.exists()
    want = "5 speakers for 'c1' contradicts --min-speakers 1 / --max-speakers 3 (1 recording(s) outside)"
    assert err == f"error: {counts}:2: {want}\n"
    code, _, err = diarize(capsys, *args, "--min-speakers", 3)
    assert code == 2 and err.startswith(f"error: {counts}:1: 2 speakers for 'c0' contradicts --min-speakers 3")
    code, _, _ = diarize(capsys, *args, "--max-speakers", 5)
    assert code == 0 and len({t.speaker for t in read_rttm(rttm)["c1"]}) >= 2


def test_outputs_that_would_lose_work_are_refused_before_any(stats_file, conversations, tmp_path, capsys):  # noqa: F811
    """--json a folder was refused after every recording was diarized (the JSON is written at the end); --rttm and
    --json naming one file left only the JSON; --rttm naming the --segments file overwrote the reference."""
    common = ["--wav-scp", conversations, "--onnx", stats_file, "--vad", "energy"]
    code, _, err = diarize(capsys, *common, "--rttm", tmp_path / "h.rttm", "--json", tmp_path)
    assert code == 2 and err == f"error: {tmp_path} is a folder, not a file: give the path of the file to write\n"
    assert not (tmp_path / "h.rttm").exists()
    same = tmp_path / "out"
    code, _, err = diarize(capsys, *common, "--rttm", same, "--json", same)
    assert code == 2 and err == f"error: --json {same} is the file of --rttm {same}: give each output its own file\n"
    assert not same.exists()
    ref = tmp_path / "ref.rttm"
    ref.write_text("SPEAKER c0 1 0.5 2.0 <NA> <NA> A <NA> <NA>\n")
    oracle = ["--wav-scp", conversations, "--onnx", stats_file, "--vad", "oracle", "--segments", ref]
    code, _, err = diarize(capsys, *oracle, "--rttm", ref)
    assert code == 2 and err == f"error: --rttm {ref} is the file of --segments {ref}: give each output its own file\n"
    assert ref.read_text() == "SPEAKER c0 1 0.5 2.0 <NA> <NA> A <NA> <NA>\n"
