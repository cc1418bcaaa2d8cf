"""The data side of diarization: RTTM / segments / UEM files (speakerlab.dataio.tables.rttm), DER with
pyannote.metrics (speakerlab-der), the synthetic conversations (speakerlab-synth-conversations), VoxConverse
on fake archives (speakerlab-voxconverse and egs/voxconverse), and the egs/mini_diar recipe end to end."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from speakerlab.dataio.tables.lists import ListError
from speakerlab.dataio.tables.rttm import (
    Turn,
    merge_intervals,
    read_reco2num_spk,
    read_rttm,
    read_speech,
    read_uem,
    rttm_lines,
)
from speakerlab.datasets import voxconverse
from speakerlab.diarization.der import der
from speakerlab.diarization.der import main as der_main
from speakerlab.synth.conversations import main as conversations_main
from tests.fake_corpora import env_ready, make_synth_corpus, recipe_env, serve, voxconverse_blobs
from tests.helpers import assert_no_traceback
from tests.test_deploy import stats_file  # noqa: F401 (the fixture: a small ONNX embedder)

REPO = Path(__file__).resolve().parent.parent


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# ---------------------------------------------------------------- RTTM, segments, UEM


def test_rttm_round_trip_and_speech_from_rttm_or_segments(tmp_path):
    turns = [Turn(0.5, 2.25, "A"), Turn(2.0, 3.0, "B"), Turn(4.0, 4.5, "A")]
    rttm = write(
        tmp_path / "ref.rttm", "SPKR-INFO x 1 <NA> <NA> <NA> unknown A <NA>\n" + "\n".join(rttm_lines("x", turns))
    )
    assert read_rttm(rttm) == {"x": turns}
    assert read_speech(rttm) == {"x": [(0.5, 3.0), (4.0, 4.5)]}
    segments = write(tmp_path / "segments", "x-1 x 0.50 2.25\nx-2 x 2.0 3.0\ny-1 y 1 2\n")
    assert read_speech(segments) == {"x": [(0.5, 3.0)], "y": [(1.0, 2.0)]}
    assert read_uem(write(tmp_path / "uem", "x 1 0.000 10.5\n")) == {"x": [(0.0, 10.5)]}
    assert merge_intervals([(3, 4), (0, 1), (1, 2), (5, 5)]) == [(0, 2), (3, 4)]


@pytest.mark.parametrize(
    "reader, text, message",
    [
        (read_rttm, "SPEAKER x 1 0.5 1.0 <NA>\n", r"f:1: an RTTM SPEAKER line has at least 8 fields, got 6"),
        (read_rttm, "SPEAKER x 1 0.5 long <NA> <NA> A\n", r"f:1: the duration must be a number, got 'long'"),
        (read_rttm, "\nSPEAKER x 1 -2 1 <NA> <NA> A\n", r"f:2: the onset must be a finite number >= 0, got '-2'"),
        (read_speech, "s1 x 2.0 1.0\n", r"f:1: segment 's1' ends \(1.0\) before it starts \(2.0\)"),
        (read_speech, "s1 x 2.0\n", r"f:1: expected 4 fields, got 3"),
        # Read as a segments file once, which blamed line 2: "expected 4 fields, got 10"
        (read_speech, "SPEAKER x 1 0.5\nSPEAKER x 1 1 1 <NA> <NA> A <NA> <NA>\n", r"f:1: an RTTM SPEAKER line has at"),
        (read_reco2num_spk, "x two\n", r"f:1: the number of speakers of 'x' must be an integer >= 1, got 'two'"),
        (read_uem, "x 1 0\n", r"f:1: a UEM line is '<recording> <channel> <start> <end>'"),
        # Dropped once: its recording was then scored over nothing, a DER of 0.00 %
        (read_uem, "x 1 0 5\ny 1 9.2 0.0\n", r"f:2: the region of 'y' ends \(0.0\) before it starts \(9.2\)"),
    ],
)
def test_bad_lines_are_named_by_file_and_line(tmp_path, reader, text, message):
    with pytest.raises(ListError, match=message):
        reader(write(tmp_path / "f", text))


# ---------------------------------------------------------------- DER


REF = [Turn(0.0, 5.0, "A"), Turn(4.0, 10.0, "B")]  # one second of overlap, 4-5
HYP = [Turn(0.0, 6.0, "x"), Turn(6.0, 10.0, "y")]  # x = A, y = B; 5-6 is B's but said to be x's


def test_der_parts_match_the_hand_count():
    # Collar 0, overlap scored: 11 s of reference speech (5 + 6); missed 1 s (the second voice of 4-5),
    # confusion 1 s (5-6), no false alarm.
    full = der({"r": REF}, {"r": HYP}, collar=0.0)
    assert full == pytest.approx(
        {"der": 2 / 11, "missed detection": 1 / 11, "false alarm": 0, "confusion": 1 / 11, "total": 11}
    )
    # Overlap skipped: 9 s scored, only the confusion is left.
    assert der({"r": REF}, {"r": HYP}, collar=0.0, skip_overlap=True)["der"] == pytest.approx(1 / 9)
    # A collar of 0.25 s leaves 0.5 s around the boundaries at 4, 5, 6 (hypothesis boundaries do not count)
    # and 0.25 s at each end unscored.
    assert der({"r": REF}, {"r": HYP}, collar=0.25)["total"] < 11
    # A recording the system has nothing for is all missed speech.
    assert der({"r": REF, "s": [Turn(0, 2, "C")]}, {"r": REF}, collar=0.0)["missed detection"] == pytest.approx(2 / 13)


def test_missed_overlapped_speech_is_counted_on_the_overlapped_stretches_alone():
    from speakerlab.diarization.der import overlap_missed

    # 4-5 holds A and B: 2 s of speaker time; one speaker there misses half of it, both miss none.
    assert overlap_missed({"r": REF}, {"r": HYP}, None, 0.0) == pytest.approx((0.5, 2.0))
    both = [*HYP, Turn(4.0, 5.0, "y")]
    assert overlap_missed({"r": REF}, {"r": both}, None, 0.0) == pytest.approx((0.0, 2.0))
    # Nothing there at all: all of it missed; a reference without overlap has nothing to miss.
    assert overlap_missed({"r": REF}, {"r": [Turn(6.0, 10.0, "y")]}, None, 0.0)[0] == pytest.approx(1.0)
    assert overlap_missed({"r": REF[:1]}, {"r": HYP}, None, 0.0) == (0.0, 0.0)


def test_der_command_prints_each_condition_and_writes_json(tmp_path, capsys):
    ref = write(tmp_path / "ref.rttm", "\n".join(rttm_lines("r", REF)) + "\n")
    hyp = write(tmp_path / "hyp.rttm", "\n".join(rttm_lines("r", HYP)) + "\n")
    assert (
        der_main(["--ref", str(ref), "--hyp", f"sys={hyp}", "--hyp", str(ref), "--out", str(tmp_path / "d.json")]) == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 + 2 * 4 and lines[3].split()[:4] == ["sys", "0.00", "scored", f"{100 * 2 / 11:.2f}"]
    assert lines[5].split()[3] == "0.00" and "1/1 (mean |error| 0.00)" in lines[1]
    result = json.loads((tmp_path / "d.json").read_text())
    assert result["sys"]["conditions"][2]["der"] == pytest.approx(2 / 11)
    assert result["sys"]["conditions"][2]["overlap_missed"] == pytest.approx(0.5) and lines[3].split()[8] == "50.00"
    assert "overlap_missed" not in result["sys"]["conditions"][3] and lines[4].split()[8] == "nan"
    assert der_main(["--ref", str(tmp_path / "nothing.rttm"), "--hyp", str(hyp)]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'nothing.rttm'}: file does not exist\n"


def test_der_command_refuses_what_it_cannot_score_as_asked_and_warns_of_silent_recordings(tmp_path, capsys):
    ref = write(tmp_path / "ref.rttm", "\n".join(rttm_lines("r", REF) + rttm_lines("q", REF)) + "\n")
    hyp = write(tmp_path / "hyp.rttm", "\n".join(rttm_lines("r", HYP)) + "\n")
    # A recording the hypothesis has no turn for is all missed speech, and said
    assert der_main(["--ref", str(ref), "--hyp", str(hyp)]) == 0
    captured = capsys.readouterr()
    assert (
        captured.err
        == f"warning: {hyp}: no turns for 1 of the reference's 2 recordings (scored as missed speech), e.g. 'q'\n"
    )
    # A UEM without an entry for a reference recording: neither scored whole nor dropped without a word
    uem = write(tmp_path / "uem", "r 1 0.000 20.000\n")
    assert der_main(["--ref", str(ref), "--hyp", str(ref), "--uem", str(uem)]) == 2
    assert capsys.readouterr().err == f"error: {uem}: no entry for recording 'q' of the reference (1 lack one)\n"
    # Two systems of one name would be one row of the JSON
    with pytest.raises(SystemExit) as stop:
        der_main(["--ref", str(ref), "--hyp", f"a={hyp}", "--hyp", f"a={ref}"])
    assert stop.value.code == 2 and "two --hyp are named 'a': give them names, NAME=RTTM" in capsys.readouterr().err
    # --out a folder: one line before the scoring, not a traceback after it
    assert der_main(["--ref", str(ref), "--hyp", str(ref), "--out", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"error: {tmp_path} is a folder, not a file: give the path of the file to write\n"
    assert captured.out == ""
    # A UEM that scores no reference speech: a DER of nothing, not 0.00 %
    empty = write(tmp_path / "late.uem", "r 1 500.0 510.0\nq 1 500.0 510.0\n")
    assert der_main(["--ref", str(ref), "--hyp", str(hyp), "--uem", str(empty)]) == 2
    captured = capsys.readouterr()
    expected = f"error: {empty} (UEM) on {ref}: no reference speech in the scored regions: the DER is undefined\n"
    assert captured.err.endswith(expected) and captured.out == ""
    # A system named by nothing
    with pytest.raises(SystemExit) as stop:
        der_main(["--ref", str(ref), "--hyp", f"={hyp}"])
    assert stop.value.code == 2 and "--hyp =RTTM: give the system a name" in capsys.readouterr().err


# ---------------------------------------------------------------- synthetic conversations


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_synth_corpus(tmp_path_factory.mktemp("corpus"), 1, 2, 4, 3, dur=(2.0, 3.0))


def test_conversations_have_the_asked_speakers_and_overlap_and_are_reproducible(tmp_path, corpus):
    args = ["--data", str(corpus / "test"), "--num-conversations", "3", "--min-speakers", "2", "--max-speakers", "3"]
    args += ["--duration", "25", "--overlap", "0.5", "--noise", str(corpus / "musan" / "noise"), "--seed", "4"]
    assert conversations_main([*args, "--out", str(tmp_path / "a")]) == 0
    assert conversations_main([*args, "--out", str(tmp_path / "b")]) == 0
    a, b = tmp_path / "a", tmp_path / "b"
    for name in ("rttm", "reco2num_spk", "uem"):
        assert (a / name).read_text() == (b / name).read_text()
    assert (a / "wav" / "conv0001.wav").read_bytes() == (b / "wav" / "conv0001.wav").read_bytes()
    ref, counts, uem = read_rttm(a / "rttm"), read_reco2num_spk(a / "reco2num_spk"), read_uem(a / "uem")
    speakers = set((corpus / "test" / "spk2utt").read_text().split()[::4])
    overlap = 0.0
    for reco, turns in ref.items():
        names = {t.speaker for t in turns}
        assert 2 <= len(names) <= 3 and counts[reco] == len(names) and names <= speakers
        wave, rate = sf.read(a / "wav" / f"{reco}.wav")
        assert rate == 16000 and uem[reco] == [(0.0, round(len(wave) / rate, 3))]
        assert max(t.end for t in turns) >= 25 and max(t.end for t in turns) < len(wave) / rate
        overlap += sum(t.end - t.start for t in turns) - sum(
            e - s for s, e in merge_intervals((t.start, t.end) for t in turns)
        )
    assert overlap > 1.0


def test_a_one_speaker_conversation_is_a_monologue_without_overlap(tmp_path, corpus):
    args = ["--data", str(corpus / "test"), "--out", str(tmp_path / "m"), "--num-conversations", "2"]
    assert (
        conversations_main([*args, "--min-speakers", "1", "--max-speakers", "1", "--overlap", "1", "--duration", "12"])
        == 0
    )
    for turns in read_rttm(tmp_path / "m" / "rttm").values():
        assert len({t.speaker for t in turns}) == 1 and len(turns) > 2
        assert all(a.end <= b.start for a, b in zip(turns, turns[1:]))


def test_conversations_in_a_room_reverberate_each_speaker_from_one_place(tmp_path, corpus, monkeypatch):
    """--rirs: the same turns as dry (the reference is the dry speech), each speaker convolved with one RIR of the
    conversation's room throughout and the speakers with different ones, a reverberant tail after every turn."""
    import speakerlab.synth.conversations as conversations

    args = ["--data", str(corpus / "test"), "--num-conversations", "2", "--min-speakers", "2", "--max-speakers", "3"]
    args += ["--duration", "20", "--seed", "4", "--pause", "0.5:1.0"]
    assert conversations_main([*args, "--out", str(tmp_path / "dry")]) == 0
    used, convolve = [], conversations.fftconvolve
    monkeypatch.setattr(conversations, "fftconvolve", lambda x, h: (used.append(h), convolve(x, h))[1])
    rirs = corpus / "RIRS_NOISES" / "simulated_rirs"
    assert conversations_main([*args, "--out", str(tmp_path / "wet"), "--rirs", str(rirs)]) == 0
    assert (tmp_path / "dry" / "rttm").read_text() == (tmp_path / "wet" / "rttm").read_text()
    ref = read_rttm(tmp_path / "wet" / "rttm")
    turns = [t for reco in sorted(ref) for t in ref[reco]]  # in the order they were placed (by start)
    assert len(used) == len(turns)
    tails = 0
    for reco in sorted(ref):
        place = {}
        for t in ref[reco]:
            place.setdefault(t.speaker, set()).add(id(used.pop(0)))
        assert all(len(p) == 1 for p in place.values()) and len(set.union(*place.values())) == len(place)
        dry, rate = sf.read(tmp_path / "dry" / "wav" / f"{reco}.wav")
        wet, _ = sf.read(tmp_path / "wet" / "wav" / f"{reco}.wav")
        for t in ref[reco]:  # the 0.1 s after a turn where nobody talks: near silence dry, the room's tail wet
            a, b = int((t.end + 0.02) * rate), int((t.end + 0.12) * rate)
            if any(u.start < t.end + 0.12 and u.end > t.end for u in ref[reco]) or b > len(dry):
                continue
            assert np.sum(wet[a:b] ** 2) > 10 * np.sum(dry[a:b] ** 2) + 1e-6, (reco, t)
            tails += 1
    assert tails >= 10


def test_conversations_need_enough_speakers(tmp_path, corpus, capsys):
    args = ["--data", str(corpus / "test"), "--out", str(tmp_path / "c"), "--min-speakers", "5", "--max-speakers", "6"]
    assert conversations_main(args) == 2
    assert capsys.readouterr().err == f"error: {corpus / 'test'}: 4 speaker(s), --min-speakers is 5\n"


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--num-conversations", "0"], "--num-conversations must be 1 or more, got 0"),
        (["--min-speakers", "0"], "need 1 <= --min-speakers <= --max-speakers, got 0, 6"),
        (["--overlap", "1.5"], "--overlap must be in [0, 1], got 1.5"),
        (["--duration", "0"], "--duration must be > 0 seconds, got 0"),  # once one turn, said nowhere
        (["--turn", "0:0"], "--turn needs HIGH > 0 seconds, got 0:0"),  # with --pause 0:0 it never ended
    ],
)
def test_conversation_settings_out_of_range_name_the_option(tmp_path, capsys, extra, message):
    with pytest.raises(SystemExit) as stop:
        conversations_main(["--data", str(tmp_path / "none"), "--out", str(tmp_path / "c"), *extra])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.splitlines()[-1].endswith(message), err
    assert not (tmp_path / "c").exists()


# ---------------------------------------------------------------- VoxConverse on fake archives


def test_voxconverse_download_extract_prepare(tmp_path):
    mirror = serve(tmp_path / "server", voxconverse_blobs())
    dl, raw, data = str(tmp_path / "dl"), str(tmp_path / "raw"), tmp_path / "data"
    assert voxconverse.main(["download", "--download-dir", dl, "--mirror", mirror, "--jobs", "1"]) == 0
    assert voxconverse.main(["extract", "--download-dir", dl, "--raw-dir", raw]) == 0
    assert voxconverse.main(["prepare", "--raw-dir", raw, "--data", str(data)]) == 0
    dev, test = data / "voxconverse_dev", data / "voxconverse_test"
    assert [line.split()[0] for line in (dev / "wav.scp").read_text().splitlines()] == ["abjxc", "afjiv"]
    assert all(os.path.isabs(line.split()[1]) for line in (dev / "wav.scp").read_text().splitlines())
    assert read_reco2num_spk(dev / "reco2num_spk") == {"abjxc": 2, "afjiv": 1}
    assert read_uem(test / "uem") == {"aepyx": [(0.0, 3.5)]}
    assert [t.speaker for t in read_rttm(test / "rttm")["aepyx"]] == ["spk03", "spk07", "spk03"]


def test_voxconverse_without_audio_says_what_to_extract(tmp_path, capsys):
    root = tmp_path / "raw" / "voxconverse"
    (root / "voxconverse-master" / "dev").mkdir(parents=True)
    (root / "audio").mkdir()
    write(root / "voxconverse-master" / "dev" / "abjxc.rttm", "SPEAKER abjxc 1 0 1 <NA> <NA> a <NA> <NA>\n")
    assert voxconverse.main(["prepare", "--raw-dir", str(tmp_path / "raw"), "--sets", "dev"]) == 2
    err = capsys.readouterr().err
    assert "1 recording(s) annotated in" in err and "is voxconverse_dev_wav.zip fully extracted" in err


def run_recipe(name: str, *args, env=None, timeout=1800):
    r = subprocess.run(
        ["bash", str(REPO / "egs" / name / "run.sh"), *map(str, args)],
        env=env or recipe_env(OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2")),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert_no_traceback(r.stdout, r.stderr)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return r


@pytest.mark.slow
@pytest.mark.skipif(not env_ready(), reason="egs/tools/env.sh would install packages")
def test_voxconverse_recipe_on_fake_archives(stats_file, tmp_path):  # noqa: F811
    """The recipe's own stage (1: download from a file:// mirror, extract, prepare) gives the data dirs of
    test_voxconverse_download_extract_prepare; stages 4-5 need a model and say so. With --segmentation_train dev
    (a tiny config: two steps of small sizes) stage 3 trains the segmentation model on dev's audio and RTTM, and
    stages 4-5 diarize and score test with its systems beside the others; training on a scored set is refused in one
    line; a re-run of stage 3 trains nothing. The embedder is tests/test_deploy.py's small ONNX graph (per window:
    mean and mean square) and the VAD the energy one: what is tested is that the stages run, each speakerlab-diarize
    process costing seconds of start-up here, not who spoke when (test_mini_diar_recipe_end_to_end)."""
    mirror = serve(tmp_path / "server", voxconverse_blobs())
    d = tmp_path / "d"
    where = ("--download_dir", d / "dl", "--raw_dir", d / "raw", "--data", d / "data", "--exp", d / "exp")
    r = run_recipe("voxconverse", "--mirror", mirror, *where, "--stop_stage", 1)
    assert "stage 1: data preparation" in r.stderr
    dev = d / "data" / "voxconverse_dev"
    assert read_reco2num_spk(dev / "reco2num_spk") == {"abjxc": 2, "afjiv": 1}
    test_turns = read_rttm(d / "data" / "voxconverse_test" / "rttm")["aepyx"]
    assert [t.speaker for t in test_turns] == ["spk03", "spk07", "spk03"]
    recipe = ["bash", str(REPO / "egs" / "voxconverse" / "run.sh")]
    r = subprocess.run(recipe, capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("error: stages 4-5 need --model_opts")
    assert len(r.stderr.splitlines()) == 1
    # Training on a set that is scored: refused before any work (the default --sets is "dev test").
    refused = [*recipe, "--model_opts", f"--onnx {stats_file}", "--segmentation_train", "dev"]
    r = subprocess.run(refused, capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and "(score the other set: --sets test)" in r.stderr
    assert r.stderr.startswith("error: --segmentation_train dev is also in --sets 'dev test'")
    missing = tmp_path / "none.onnx"  # a given model that is not there: refused before any work too
    r = subprocess.run([*refused[:-2], "--segmentation", missing], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.splitlines() == [
        f"error: --segmentation {missing}: no such file (a segmentation model's ONNX file)"
    ]

    tiny = "steps=2 batch_size=2 window=1.0 filters=8 channels=8 hidden=8 layers=1 warmup=0 log_every=1"
    seg = ("--sets", "test", "--segmentation_train", "dev", "--seg_opts", " ".join(f"--set {x}" for x in tiny.split()))
    run = (*where, *seg, "--model_opts", f"--onnx {stats_file}", "--vad", "energy", "--stage", 3)
    r = run_recipe("voxconverse", *run)
    log = r.stderr
    assert f"stage 3: train the segmentation model (../../conf/diarization/segmentation_cpu.yaml) on {dev}" in log
    assert "step 2 loss" in (d / "exp" / "segmentation" / "train.log").read_text()
    model = d / "exp" / "segmentation" / "segmentation.onnx"
    assert f"stage 4: diarize {d / 'data' / 'voxconverse_test'} (--onnx {stats_file}; segmentation {model})" in log
    result = json.loads((d / "exp" / "test" / "der.json").read_text())
    assert {"segmentation", "segmentation_oracle_count", "estimated", "one_speaker"} <= set(result)
    assert "vbx" not in result and "segmentation_vbx" not in result  # no --plda_data: no PLDA
    rows = (d / "exp" / "test" / "der.txt").read_text()
    assert all(f"{name} " in rows for name in ("segmentation", "segmentation_oracle_count"))
    # Re-run: the model is up to date (the same lists, config and options): nothing trained, no torch start-up.
    r = run_recipe("voxconverse", *run[:-1], 3, "--stop_stage", 3)
    assert "is up to date" in r.stderr and "train the segmentation model" not in r.stderr


@pytest.mark.slow
@pytest.mark.skipif(not env_ready(), reason="egs/tools/env.sh would install packages")
def test_mini_diar_recipe_end_to_end(mini_model, tmp_path):
    """egs/mini_diar on the session's egs/mini corpus and model (tests/conftest.py: mini_model is this recipe's
    stage 3, egs/mini training a small CAM++, shared with tests/test_mini_recipe.py): the conversations of its
    test speakers are diarized (VBx among the systems, on the PLDA of stage 3), and the model's DER is below the
    one-speaker baseline's."""
    r = run_recipe(
        "mini_diar",
        *("--mini_data", mini_model.data, "--model", mini_model.exp, "--data", tmp_path / "data"),
        *("--exp", tmp_path / "exp", "--num_conversations", 3, "--conv_opts", "--max-speakers 3 --duration 40"),
        *("--segmenter", "false"),  # test_segmentation.py trains one; its systems are in bench/RESULTS.md
    )
    # The shared model and corpus are only read: stage 3 finds the checkpoint and trains nothing.
    assert f"stage 3: train: {mini_model.exp} has a checkpoint, nothing to do" in r.stderr + r.stdout
    result = json.loads((tmp_path / "exp" / "der.json").read_text())
    model, baseline = result["estimated"]["conditions"][0], result["one_speaker"]["conditions"][0]
    assert model["collar"] == 0.25 and not model["skip_overlap"]
    assert model["der"] < baseline["der"], r.stdout
    assert result["oracle_count"]["count_right"] == 3
    assert all(np.isfinite(c["der"]) for s in result.values() for c in s["conditions"])
    # Stage 3 fitted VBx's PLDA; the VAD and the embeddings ran once per recording: later systems reused them.
    assert "vbx" in result and "(speech and embeddings from the cache)" in (tmp_path / "exp" / "vbx.log").read_text()
