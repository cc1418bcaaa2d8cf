"""The segmentation model (speakerlab.diarization.segmentation): powerset mapping, the permutation-invariant
loss, and learning on simulated windows."""

import itertools
import os
import sys

import numpy as np
import pytest
import torch

from speakerlab.dataio.audio import read_audio
from speakerlab.diarization.segmentation import (
    MAX_ACTIVE,
    NUM_CLASSES,
    NUM_LOCAL,
    POWERSET,
    SegmentationModel,
    SegmentationShape,
    frame_labels,
    powerset_loss,
    to_multilabel,
    to_powerset,
)


def test_powerset_classes_are_the_small_subsets():
    assert NUM_CLASSES == 7 and POWERSET[0] == ()
    assert all(len(c) <= MAX_ACTIVE for c in POWERSET) and len(set(POWERSET)) == NUM_CLASSES


def test_powerset_mapping_round_trips():
    classes = torch.arange(NUM_CLASSES).repeat(3).reshape(3, NUM_CLASSES)
    active = to_multilabel(classes)
    assert active.shape == (3, NUM_CLASSES, NUM_LOCAL)
    assert torch.equal(to_powerset(active), classes)
    for members in itertools.product((0, 1), repeat=NUM_LOCAL):
        v = torch.tensor(members, dtype=torch.float32)
        c = int(to_powerset(v[None])[0])
        if sum(members) > MAX_ACTIVE:
            assert c == -1
        else:
            assert torch.equal(to_multilabel(torch.tensor([c]))[0], v)


def test_loss_is_invariant_to_the_order_of_reference_speakers():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 50, NUM_CLASSES, generator=g)
    reference = (torch.rand(4, 50, NUM_LOCAL, generator=g) < 0.35).float()
    base = powerset_loss(logits, reference)
    for order in itertools.permutations(range(NUM_LOCAL)):
        assert torch.allclose(powerset_loss(logits, reference[..., list(order)]), base)
    # Per window: each window may take its own order.
    mixed = torch.stack([reference[0][:, [1, 0, 2]], reference[1][:, [2, 1, 0]], reference[2], reference[3]])
    assert torch.allclose(powerset_loss(logits, mixed), base)
    # The loss is a cross-entropy: logits that name the reference (in some order) give a small one.
    target = to_powerset(reference[..., [2, 0, 1]]).clamp(min=0)
    sure = torch.nn.functional.one_hot(target, NUM_CLASSES).float() * 20
    assert powerset_loss(sure, reference) < 1e-3 < base


def test_frame_labels_number_speakers_by_first_frame_and_keep_the_main_three():
    t = SegmentationModel.num_frames(32000)
    turns = [(1.0, 1.8, "b"), (0.1, 1.2, "a"), (0.5, 0.6, "d"), (1.5, 2.0, "c")]
    labels = frame_labels(turns, t)
    centres = SegmentationModel.frame_centres(t)
    assert labels.shape == (t, NUM_LOCAL)
    # "d" talks least and is dropped; the rest in order of their first frame: a, b, c.
    assert np.array_equal(labels[:, 0] > 0, (centres >= 0.1) & (centres < 1.2))
    assert np.array_equal(labels[:, 1] > 0, (centres >= 1.0) & (centres < 1.8))
    assert np.array_equal(labels[:, 2] > 0, (centres >= 1.5) & (centres < 2.0))
    assert np.array_equal(frame_labels([(5.0, 6.0, "a")], t, offset=4.5)[:, 0] > 0, (centres >= 0.5) & (centres < 1.5))


def simulated_batch(rng: np.random.Generator, batch: int, seconds: float = 2.0):
    """Windows of up to 3 'speakers' (harmonic tones of their own pitch and timbre, speaking in turns
    that sometimes overlap) -> waves (B, S), reference (B, T, 3)."""
    n = int(seconds * 16000)
    t = np.arange(n) / 16000
    frames = SegmentationModel.num_frames(n)
    waves, refs = np.zeros((batch, n), np.float32), []
    for b in range(batch):
        turns, pos, last = [], rng.uniform(0, 0.3), None
        speakers = rng.choice(3, size=int(rng.integers(1, 4)), replace=False)
        while pos < seconds:
            spk = int(rng.choice([s for s in speakers if s != last] or speakers))
            end = pos + rng.uniform(0.3, 0.9)
            turns.append((pos, end, spk))
            last = spk
            # Half of the next turns start before this one ends: overlap.
            pos = end - rng.uniform(0.1, 0.4) if rng.random() < 0.5 else end + rng.uniform(0.05, 0.3)
        voices = {s: (rng.uniform(90, 300), rng.uniform(0.5, 0.9)) for s in speakers}
        for start, end, spk in turns:
            f0, tilt = voices[spk]
            on = (t >= start) & (t < end)
            tone = sum(tilt**h * np.sin(2 * np.pi * f0 * h * t + h) for h in range(1, 8))
            waves[b] += (0.1 * tone * on).astype(np.float32)
        waves[b] += 0.003 * rng.standard_normal(n).astype(np.float32)
        refs.append(frame_labels(turns, frames))
    return torch.from_numpy(waves), torch.from_numpy(np.stack(refs))


@pytest.mark.slow
def test_model_learns_speech_and_overlap_on_simulated_windows():
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    model = SegmentationModel(SegmentationShape(filters=24, channels=32, hidden=32))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    test_wave, test_ref = simulated_batch(np.random.default_rng(99), 32)
    model.eval()
    with torch.no_grad():
        before = float(powerset_loss(model(test_wave), test_ref))
    model.train()
    for _ in range(120):
        wave, ref = simulated_batch(rng, 16)
        loss = powerset_loss(model(wave), ref)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        logits = model(test_wave)
    after = float(powerset_loss(logits, test_ref))
    assert after < 0.6 * before, (before, after)
    predicted = to_multilabel(logits.argmax(-1)).sum(-1)  # (B, T) speakers found per frame
    truth = test_ref.sum(-1)
    overlap = truth >= 2
    recall = float((predicted[overlap] >= 2).float().mean())
    false_alarm = float((predicted[~overlap] >= 2).float().mean())
    # Above chance after 120 steps (about 0.3 of overlapped frames found, 0.3% false alarms): a model that
    # guessed would call overlap as often on the frames without it.
    assert overlap.float().mean() > 0.1 and recall > 0.2 and false_alarm < 0.1 * recall, (recall, false_alarm)
    speech_found = float(((predicted > 0) == (truth > 0)).float().mean())
    assert speech_found > 0.9


@pytest.mark.parametrize("frontend", ["learnt", "fbank"])
def test_model_shapes_match_frame_count(frontend):
    model = SegmentationModel(SegmentationShape(frontend=frontend, dropout=0.3)).eval()
    for n in (800, 16000, 32123):
        with torch.no_grad():
            out = model(torch.zeros(2, n))
        assert out.shape == (2, SegmentationModel.num_frames(n), NUM_CLASSES) and torch.isfinite(out).all()


def test_fbank_front_end_is_the_log_mel_energy_of_each_frame():
    from speakerlab.diarization.segmentation import HOP, KERNEL, Fbank, mel_matrix

    mel = mel_matrix(40, KERNEL // 2 + 1).numpy()
    # Triangles rising in frequency, each over some DFT bins (the lowest are narrower than the 40-Hz bin spacing:
    # their peaks fall between bins, as in Kaldi's); every bin between 20 Hz and Nyquist is in some filter.
    assert mel.shape == (40, 201) and (mel.max(1) > 0.5).all() and (mel.max(1) <= 1).all()
    assert np.all(np.diff(mel.argmax(1)) > 0) and (mel[:, 1:-1].sum(0) > 0).all()  # Nyquist: the last edge
    wave = np.random.default_rng(0).standard_normal(4000).astype(np.float32) * 0.1
    got = Fbank(40)(torch.from_numpy(wave)[None, None])[0].numpy()  # (40, T0)
    assert got.shape == (40, (4000 - KERNEL) // HOP + 1)
    for t in (0, 7, got.shape[1] - 1):
        frame = wave[t * HOP : t * HOP + KERNEL] * np.hamming(KERNEL)
        want = np.log(mel @ np.abs(np.fft.rfft(frame)) ** 2 + 1e-6)
        assert np.abs(got[:, t] - want).max() < 1e-3
    # Its transform is fixed: buffers, no parameters; the model's only learnt front-end weights are the norm's.
    model = SegmentationModel(SegmentationShape(frontend="fbank"))
    assert not list(model.filterbank.parameters()) and "filterbank.basis" in model.state_dict()


def test_shapes_saved_before_the_front_end_option_load_as_learnt():
    old = {"filters": 8, "channels": 8, "hidden": 8, "layers": 2}  # a segmentation.pt 'shape' of before
    model = SegmentationModel(SegmentationShape(**old))
    assert model.shape.frontend == "learnt" and model.shape.dropout == 0.0
    assert isinstance(model.filterbank, torch.nn.Conv1d)
    with pytest.raises(ValueError, match="frontend"):
        SegmentationModel(SegmentationShape(frontend="sinc"))


def test_learning_rate_warms_up_then_follows_a_half_cosine():
    from speakerlab.diarization.segmentation_train import SegmentationTrainSettings

    s = SegmentationTrainSettings(steps=110, warmup=10, schedule="cosine")
    assert s.lr_factor(0) == pytest.approx(0.1) and s.lr_factor(9) == pytest.approx(1.0)
    assert s.lr_factor(10) == pytest.approx(1.0) and s.lr_factor(60) == pytest.approx(0.5)
    assert s.lr_factor(109) < 0.01
    flat = SegmentationTrainSettings(steps=110)
    assert {flat.lr_factor(i) for i in range(110)} == {1.0}


def test_frame_error_takes_the_best_order_per_window():
    from speakerlab.diarization.segmentation_train import frame_error

    g = torch.Generator().manual_seed(0)
    reference = (torch.rand(3, 40, NUM_LOCAL, generator=g) < 0.3).float()
    reference[..., 2] = 0  # at most two at once: every frame has a class
    target = torch.stack(
        [to_powerset(reference[0][:, [1, 0, 2]]), to_powerset(reference[1]), to_powerset(reference[2])]
    )
    sure = torch.nn.functional.one_hot(target, NUM_CLASSES).float()
    assert frame_error(sure, reference) == 0.0
    wrong = sure.clone()
    wrong[0, :10] = torch.nn.functional.one_hot(torch.tensor(6), NUM_CLASSES).float()  # {1, 2}: nobody has 2
    assert frame_error(wrong, reference) == pytest.approx(10 / 120)


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_onnx_frame_scores_match_torch(tmp_path):
    """The fbank front end (segmentation_cpu.yaml's); the learnt one is exported by the training command's test.
    One file serves any batch and length: batches of 1, 2 and 3, lengths of 0.04-3.1 s, each within 1e-4 of torch."""
    pytest.importorskip("onnxruntime")
    from speakerlab.diarization.segmentation import export_onnx
    from speakerlab.diarization.segmenter import OnnxSegmenter

    torch.manual_seed(1)
    # Two LSTM layers: torch.export could not decompose one nn.LSTM of two (the model stacks single layers).
    shape = SegmentationShape(filters=16, channels=16, hidden=16, layers=2, frontend="fbank", dropout=0.2)
    model = SegmentationModel(shape).eval()
    path = tmp_path / "seg.onnx"
    export_onnx(model, path)
    segmenter = OnnxSegmenter(path, threads=1)
    assert segmenter.num_local == NUM_LOCAL and segmenter.powerset.shape == (NUM_CLASSES, NUM_LOCAL)
    wave, _ = simulated_batch(np.random.default_rng(3), 2, seconds=3.1)
    rng = np.random.default_rng(4)
    others = [torch.from_numpy(rng.standard_normal((3, n)).astype(np.float32) * 0.1) for n in (700, 33333)]
    for x in (wave, wave[0, :20017], *others):  # a batch, one wave of another length, batches of 3
        with torch.no_grad():
            ref = torch.log_softmax(model(x if x.ndim == 2 else x[None]), -1).numpy()
        got = segmenter.scores(x.numpy())
        got = got if got.ndim == 3 else got[None]
        assert got.shape == ref.shape and np.abs(got - ref).max() < 1e-4
    t = ref.shape[1]
    assert np.allclose(segmenter.frame_centres(t), SegmentationModel.frame_centres(t))
    assert np.array_equal(segmenter.activities(wave.numpy()), to_multilabel(model(wave).argmax(-1)).numpy())
    # A recording in windows of 1 s every 0.5 s (the last one zero-padded): each window's activities, in order.
    x = wave[0].numpy()
    acts, step = segmenter.sliding(x, window=1.0, step=0.5)
    padded = np.pad(x, (0, 56000 - len(x)))
    parts = [segmenter.activities(padded[a : a + 16000]) for a in range(0, 40001, 8000)]
    assert step == 25 and np.array_equal(acts, np.stack(parts))


def write_conversations(folder, count: int = 4, seconds: float = 4.0):
    """A data folder of `count` simulated recordings: wav/, wav.scp, rttm (speakers named per recording)."""
    import soundfile as sf

    rng = np.random.default_rng(5)
    (folder / "wav").mkdir(parents=True)
    scp, rttm = [], []
    for i in range(count):
        wave, ref = simulated_batch(rng, 1, seconds)
        path = folder / "wav" / f"r{i}.wav"
        sf.write(str(path), wave[0].numpy(), 16000, subtype="FLOAT")
        scp.append(f"r{i} {path}")
        centres = SegmentationModel.frame_centres(ref.shape[1])
        for k in range(NUM_LOCAL):
            for j in np.flatnonzero(ref[0, :, k].numpy()):
                rttm.append(f"SPEAKER r{i} 1 {centres[j] - 0.01:.3f} 0.020 <NA> <NA> s{k} <NA> <NA>")
    (folder / "wav.scp").write_text("\n".join(scp) + "\n")
    (folder / "rttm").write_text("\n".join(rttm) + "\n")


def test_training_config_errors_name_the_key(tmp_path, capsys):
    from speakerlab.diarization.segmentation_train import main

    config = tmp_path / "seg.yaml"
    config.write_text("window: 2.0\nstepz: 3\n")
    assert main(["--data", str(tmp_path), "--out", str(tmp_path / "exp"), "--config", str(config)]) == 2
    assert "stepz" in capsys.readouterr().err
    assert main(["--data", str(tmp_path), "--out", str(tmp_path / "exp"), "--set", "window=0.1"]) == 2
    assert "window" in capsys.readouterr().err
    assert not (tmp_path / "exp").exists()


def test_training_without_onnx_stops_before_the_first_step(tmp_path, capsys, monkeypatch):
    """The model's file is written after the last step: an environment without the onnx package is refused at the
    start, in one line naming it, not after the training it would lose (a fresh diarization venv lacked it)."""
    from speakerlab.diarization.segmentation_train import main

    write_conversations(tmp_path / "data")
    monkeypatch.setitem(sys.modules, "onnx", None)  # `import onnx` raises ImportError
    assert main(["--data", str(tmp_path / "data"), "--out", str(tmp_path / "exp"), "--set", "steps=2"]) == 2
    err = capsys.readouterr().err
    assert "pip install onnx" in err and "step 1" not in err and "Traceback" not in err
    assert not (tmp_path / "exp").exists()


def test_training_audio_that_is_missing_or_not_16k_mono_names_its_wav_scp_line(tmp_path, capsys):
    """A missing file once said "cannot read audio: Error opening ...: System error.", and neither message named the
    wav.scp line, as speakerlab-diarize's and speakerlab-plda's do."""
    import soundfile as sf

    from speakerlab.diarization.segmentation_train import main

    write_conversations(tmp_path / "data", count=2)
    scp = tmp_path / "data" / "wav.scp"
    lines = scp.read_text().splitlines()
    args = ["--data", str(tmp_path / "data"), "--out", str(tmp_path / "exp"), "--set", "steps=1"]
    scp.write_text(f"{lines[0]}\nr1 {tmp_path / 'gone.wav'}\n")
    assert main(args) == 2
    assert capsys.readouterr().err == f"error: no such file: {tmp_path / 'gone.wav'} ({scp} line 2)\n"
    sf.write(str(tmp_path / "r1_8k.wav"), np.zeros(8000, np.float32), 8000)
    scp.write_text(f"{lines[0]}\nr1 {tmp_path / 'r1_8k.wav'}\n")
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path / 'r1_8k.wav'}: ") and err.endswith(f" ({scp} line 2)\n")
    assert len(err.splitlines()) == 1 and not (tmp_path / "exp").exists()


def test_training_windows_carry_the_rttm_labels(tmp_path):
    from speakerlab.diarization.segmentation_train import Recordings

    write_conversations(tmp_path)
    recordings = Recordings(str(tmp_path))
    waves, labels = recordings.batch(np.random.default_rng(0), 6, 1.5)
    assert waves.shape == (6, 24000) and labels.shape == (6, SegmentationModel.num_frames(24000), NUM_LOCAL)
    fixed = recordings.fixed(5, 1.5)
    assert fixed[0].shape == (5, 24000) and all(np.array_equal(a, b) for a, b in zip(fixed, recordings.fixed(5, 1.5)))
    whole = read_audio(str(tmp_path / "wav" / "r1.wav"))
    assert np.array_equal(fixed[0][2], whole[:24000])  # two whole 1.5-s windows per 4-s recording
    # Silence and speech alike are labelled: some frames have nobody, some one speaker, some two.
    counts = labels.sum(-1)
    assert (counts == 0).any() and (counts == 1).any() and (counts == 2).any()
    # Labelled frames are louder than unlabelled ones (the labels sit where the tones are).
    frames = waves[:, : labels.shape[1] * 320].reshape(6, labels.shape[1], 320)
    energy = (frames**2).mean(-1)
    assert energy[counts > 0].mean() > 10 * energy[counts == 0].mean()


def test_training_windows_are_the_decoded_audio_whatever_the_encoding(tmp_path):
    """Recordings holds 16-bit PCM files as int16 and reads other encodings' windows from disk: every window
    drawn (and every one longer than its recording, zero-padded) is the one cut from the whole float32 decoding,
    sample for sample, under the same draws; 16-bit files are held at two bytes a sample."""
    import soundfile as sf

    from speakerlab.diarization.segmentation_train import Recordings

    write_conversations(tmp_path, count=4)
    for name in ("r0", "r2"):  # two 16-bit files beside two float ones
        path = str(tmp_path / "wav" / f"{name}.wav")
        sf.write(path, sf.read(path, dtype="float32")[0], 16000, subtype="PCM_16")
    recordings = Recordings(str(tmp_path))
    assert sorted(recordings.pcm) == ["r0", "r2"] and all(w.dtype == np.int16 for w in recordings.pcm.values())
    whole = {r: read_audio(str(tmp_path / "wav" / f"{r}.wav")) for r in recordings.names}
    for seconds in (1.5, 5.0):  # 5 s: longer than every 4-s recording
        n = int(seconds * 16000)
        waves, labels = recordings.batch(np.random.default_rng(3), 16, seconds)
        draws, expected = np.random.default_rng(3), np.zeros((16, n), np.float32)
        for b in range(16):  # the draws of Recordings.batch, cut from the whole decoding
            reco = recordings.names[int(draws.integers(4))]
            start = int(draws.integers(max(len(whole[reco]) - n, 0) + 1))
            piece = whole[reco][start : start + n]
            expected[b, : len(piece)] = piece
        assert waves.dtype == np.float32 and np.array_equal(waves, expected)
    fixed = recordings.fixed(8, 2.0)[0]
    assert np.array_equal(fixed, np.stack([whole[r][a : a + 32000] for r in recordings.names for a in (0, 32000)]))


@pytest.mark.slow
def test_training_command_writes_weights_and_onnx(tmp_path):
    """The command as a user runs it, in a process of its own: validation, the weights and the ONNX file, which
    gives the weights' frame scores."""
    pytest.importorskip("onnxruntime")
    import subprocess
    import sys

    write_conversations(tmp_path / "data")
    args = ["--data", str(tmp_path / "data"), "--out", str(tmp_path / "exp")]
    sets = ["steps=3", "batch_size=2", "window=1.0", "filters=8", "channels=8", "hidden=8", "frontend=learnt"]
    sets += [f"val_data={tmp_path / 'data'}", "val_every=2", "val_windows=5", "schedule=cosine", "warmup=1"]
    code = "import sys; from speakerlab.diarization.segmentation_train import main; sys.exit(main(sys.argv[1:]))"
    command = [sys.executable, "-c", code, *args, *[x for s in sets for x in ("--set", s)]]
    run = subprocess.run(command, text=True, capture_output=True)
    assert run.returncode == 0, run.stderr
    # Validation at step 2 and at the last step, on the same 5 windows.
    assert [line.split()[1] for line in run.stderr.splitlines() if "validation loss" in line] == ["2", "3"]
    saved = assert_onnx_file_gives_the_saved_weights_scores(tmp_path / "exp")
    assert saved["shape"]["hidden"] == 8 and saved["settings"]["steps"] == 3 and saved["shape"]["frontend"] == "learnt"


def assert_onnx_file_gives_the_saved_weights_scores(exp) -> dict:
    """The training command's segmentation.onnx gives the frame scores of its segmentation.pt (loaded as saved, no
    map_location) on a second of noise; returns what segmentation.pt holds."""
    from speakerlab.diarization.segmenter import OnnxSegmenter

    saved = torch.load(exp / "segmentation.pt")
    model = SegmentationModel(SegmentationShape(**saved["shape"])).eval()
    model.load_state_dict(saved["state"])
    wave = np.random.default_rng(0).standard_normal(16000).astype(np.float32) * 0.1
    with torch.no_grad():
        ref = torch.log_softmax(model(torch.from_numpy(wave)[None]), -1)[0].numpy()
    assert np.abs(OnnxSegmenter(exp / "segmentation.onnx").scores(wave) - ref).max() < 1e-4
    return saved


def test_a_stopped_or_crashed_training_resumes_to_the_weights_of_a_run_never_stopped(
    tmp_path, monkeypatch, capsys, ctrl_c
):
    """A scheduler's signal (75) and Ctrl-C (130) stop the command after the step with OUT/checkpoint.pt, a crash
    keeps the last one (`save_every`), and the same command resumes each time: the final weights equal, bit for
    bit, those of a run never stopped (dropout on: the generators are carried too). A checkpoint of other settings
    is said and set aside."""
    import signal

    from speakerlab.diarization import segmentation
    from speakerlab.diarization.segmentation_train import main

    write_conversations(tmp_path / "data", count=2, seconds=2.0)
    sets = ["steps=8", "save_every=3", "batch_size=2", "window=1.0", "filters=8", "channels=8", "hidden=8"]
    sets += ["dropout=0.2", "schedule=cosine", "warmup=2", "log_every=1"]

    def train(out, *more) -> int:
        return main(
            ["--data", str(tmp_path / "data"), "--out", str(out), *[x for s in (*sets, *more) for x in ("--set", s)]]
        )

    assert train(tmp_path / "a") == 0
    real_loss, calls = segmentation.powerset_loss, []

    def interrupt_at(call: int, what):
        calls.clear()

        def loss(*args):
            calls.append(1)
            if len(calls) == call:
                what()
            return real_loss(*args)

        monkeypatch.setattr(segmentation, "powerset_loss", loss)

    def crash():
        raise RuntimeError("the machine went down")

    exp, ckpt = tmp_path / "b", tmp_path / "b" / "checkpoint.pt"
    saved = lambda: torch.load(ckpt)["step"]  # noqa: E731
    interrupt_at(2, lambda: os.kill(os.getpid(), signal.SIGTERM))
    assert train(exp) == 75 and saved() == 2 and not (exp / "segmentation.pt").exists()
    assert f"stopped by SIGTERM at step 2: {ckpt} written; exit code 75" in capsys.readouterr().err
    interrupt_at(3, crash)  # steps 3 (saved: save_every) and 4, then a crash in step 5
    with pytest.raises(RuntimeError):
        train(exp)
    assert saved() == 3
    interrupt_at(1, lambda: os.kill(os.getpid(), signal.SIGINT))  # step 4, again
    assert train(exp) == 130 and saved() == 4
    err = capsys.readouterr().err
    assert f"resumed from {ckpt} at step 3" in err and "SIGINT (Ctrl-C): the run stops after this step" in err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    # Another run's checkpoint (another seed) is said and set aside; this one is left for the command below.
    other = tmp_path / "c"
    other.mkdir()
    (other / "checkpoint.pt").write_bytes(ckpt.read_bytes())
    monkeypatch.setattr(segmentation, "powerset_loss", real_loss)
    assert train(other, "seed=1", "steps=1") == 0
    assert (
        f"{other / 'checkpoint.pt'} is of another run (steps 8 -> 1, seed 0 -> 1): starting again"
        in capsys.readouterr().err
    )
    assert train(exp) == 0 and not ckpt.exists()
    a, b = (torch.load(x / "segmentation.pt")["state"] for x in (tmp_path / "a", exp))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
