"""speakerlab-verify and speakerlab-embed (speakerlab.inference.cli), and audio of any rate / channel count
(speakerlab.dataio.waveform.resample)."""

from __future__ import annotations

import importlib
import json
import math
import re
import shutil
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

from speakerlab.dataio.tables.embeddings import read_embeddings
from speakerlab.dataio.waveform.resample import (
    MAX_WEIGHTS,
    MultiChannelWarning,
    _weights,
    rate_ratio,
    read_for_model,
    resample,
)
from speakerlab.features.fbank import Fbank
from speakerlab.inference.cli import DEFAULT_THRESHOLD, eer_threshold, run_embed, run_verify
from speakerlab.inference.common import MIN_FRAMES
from speakerlab.inference.embedder import load_embedder
from speakerlab.models import build_model
from tests.helpers import write_wav

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def wavs(tmp_path):
    """Three 16 kHz mono files of 1.0, 1.2 and 1.4 s."""
    rng = np.random.default_rng(0)
    return [str(write_wav(tmp_path / f"w{i}.wav", 0.1 * rng.standard_normal(16000 + 3200 * i))) for i in range(3)]


def write_scp(path: Path, entries) -> Path:
    path.write_text("".join(f"{u} {p}\n" for u, p in entries))
    return path


def parse_verify(out: str):
    """speakerlab-verify's stdout -> (score, threshold, decision line)."""
    lines = out.strip().splitlines()
    assert len(lines) == 3 and lines[0].startswith("score ") and lines[1].startswith("threshold ")
    return float(lines[0].split()[1]), float(lines[1].split()[1]), lines[2]


def cosine(a, b) -> float:
    return float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b))


def test_every_command_has_a_console_script_that_runs():
    """Each module with a `main(argv)` is a `speakerlab-<command>` script; each entry point answers --help
    with exit 0 and a bad option with exit 2; the installed scripts are on PATH (env.sh installs them)."""
    tomllib = pytest.importorskip(
        "tomllib" if __import__("sys").version_info >= (3, 11) else "tomli",
        reason="Python 3.10 reads pyproject.toml with the tomli package, which is not installed",
    )
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    with_main = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts)
        for p in (ROOT / "speakerlab").rglob("*.py")
        if re.search(r"^def main\(argv", p.read_text(), re.M)
    }
    assert with_main <= {target.split(":")[0] for target in scripts.values()}
    for name, target in scripts.items():
        module, func = target.split(":")
        entry = getattr(importlib.import_module(module), func)
        for argv, code in ((["--help"], 0), (["--no-such-option"], 2)):
            with pytest.raises(SystemExit) as e:
                sys.exit(entry(argv))
            assert e.value.code == code, (name, argv)
    if shutil.which("speakerlab-train") is None:
        pytest.skip("console scripts not installed in this environment (bash tests/run.sh installs them)")
    r = subprocess.run(["speakerlab-score", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--trials" in r.stdout


# --- resampling and reading ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "source,target", [(8000, 16000), (11025, 16000), (22050, 16000), (44100, 16000), (48000, 16000), (16000, 8000)]
)
def test_resample_matches_scipy_resample_poly(source, target):
    from scipy.signal import resample_poly

    up, down = rate_ratio(source, target)
    assert Fraction(up, down) == Fraction(target, source) and math.gcd(up, down) == 1
    rng = np.random.default_rng(source)
    # Full scale: a sweep plus noise, clipped to [-1, 1].
    t = np.arange(source // 2) / source
    x = np.clip(0.7 * np.sin(2 * np.pi * (200 + 4000 * t) * t) + 0.2 * rng.standard_normal(t.size), -1, 1)
    ours = resample(x.astype(np.float32), source, target)
    ref = resample_poly(x.astype(np.float32).astype(np.float64), up, down)
    assert ours.dtype == np.float32 and ours.shape == ref.shape == (-(-x.size * up // down),)
    np.testing.assert_allclose(ours, ref, atol=1e-5, rtol=0)  # float32 arithmetic vs scipy's float64


def test_resampler_filter_sizes_stay_small():
    assert rate_ratio(44100, 16000) == (160, 441) and rate_ratio(8000, 16000) == (2, 1)
    for source in (8000, 11025, 12000, 22050, 24000, 32000, 44100, 48000, 88200, 96000, 192000):
        for target in (16000, 8000):
            up, down = rate_ratio(source, target)
            if up != down:
                assert _weights(up, down)[1].size <= MAX_WEIGHTS
    assert _weights(160, 441)[1].size < 80_000  # 44.1 kHz: 160 phases x 493 taps
    with pytest.raises(ValueError, match="16001 Hz -> 16000 Hz"):
        rate_ratio(16001, 16000)  # 16000 x 16001 phases: about 256 M weights


def test_read_for_model_takes_the_first_channel_with_a_warning(tmp_path):
    rng = np.random.default_rng(1)
    stereo = (0.1 * rng.standard_normal((8000, 2))).astype(np.float32)
    path = write_wav(tmp_path / "st.wav", stereo, subtype="FLOAT")
    with pytest.warns(MultiChannelWarning, match=re.escape(f"{path}: 2 channels, using the first")):
        wave = read_for_model(str(path), 16000)
    np.testing.assert_array_equal(wave, stereo[:, 0])
    got = []
    wave8 = read_for_model(str(path), 8000, warn=got.append)  # a callback instead of warnings.warn
    assert got == [f"{path}: 2 channels, using the first"] and wave8.shape == (4000,)


def band_limited(sample_rate: int, seconds: float = 1.5, fmax: float = 3000.0) -> np.ndarray:
    """The same continuous signal sampled at any rate: 40 amplitude-modulated sinusoids of 100..fmax Hz."""
    rng = np.random.default_rng(7)
    f, a, ph, fm = (
        rng.uniform(100, fmax, 40),
        rng.uniform(0.2, 1, 40),
        rng.uniform(0, 6.28, 40),
        rng.uniform(1, 6, 40),
    )
    t = np.arange(int(seconds * sample_rate))[:, None] / sample_rate
    x = (a * (1 + np.sin(2 * np.pi * fm * t + ph)) * np.sin(2 * np.pi * f * t + ph)).sum(axis=1)
    return (0.5 * x / np.abs(x).max()).astype(np.float32)


def test_other_rates_of_the_same_signal_embed_close_to_16k(ckpt, tmp_path, capsys):
    """8 and 44.1 kHz files of one band-limited (< 3 kHz) signal vs its 16 kHz file, through speakerlab-embed.

    Measured (this model and signal): the log-mel bins below about 2.8 kHz agree within 0.03 (8 kHz) and
    0.06 (44.1 kHz, largest at the edges); the relative embedding distance |e - e16| / |e16| is 0.016
    (44.1 kHz) and 0.063 (8 kHz), vs 0.35 for another signal. Asserted: < 0.1 for the features, < 0.05 and
    < 0.15 for the embeddings. The 8 kHz file is further off because of the mel bins above about 6 kHz:
    the 16 kHz file has no energy there at all (log floored at float eps), the upsampled one the resampling
    filter's stopband leakage (about -57 dB), a few nats apart in the log domain."""
    paths = {
        sr: str(write_wav(tmp_path / f"s{sr}.wav", band_limited(sr), sr, subtype="FLOAT"))
        for sr in (8000, 16000, 44100)
    }
    other = str(write_wav(tmp_path / "other.wav", band_limited(16000, fmax=2000.0)[::-1].copy(), subtype="FLOAT"))
    scp = write_scp(tmp_path / "wav.scp", [*((f"r{sr}", p) for sr, p in paths.items()), ("other", other)])
    assert run_embed([str(scp), str(tmp_path / "e.npz"), "--checkpoint", str(ckpt), "--device", "cpu"]) == 0
    ids, emb = read_embeddings(tmp_path / "e.npz")
    assert ids == ["r8000", "r16000", "r44100", "other"]
    ref = emb[1]
    dist = [float(np.linalg.norm(e - ref) / np.linalg.norm(ref)) for e in emb]
    assert dist[2] < 0.05 and dist[0] < 0.15 and dist[3] > 2 * dist[0]

    embedder = load_embedder(ckpt, device="cpu")
    feats = {
        sr: Fbank(embedder.spec.fbank)(torch.from_numpy(read_for_model(p, 16000))[None])[0] for sr, p in paths.items()
    }
    low = slice(0, 48)  # mel bins whose upper edge is below about 2.8 kHz (of 80 bins, 20 Hz .. 8 kHz)
    for sr in (8000, 44100):
        assert feats[sr].shape == feats[16000].shape
        assert float((feats[sr][:, low] - feats[16000][:, low]).abs().max()) < 0.1


# --- the commands ------------------------------------------------------------------------------------------


def test_verify_prints_the_cosine_of_the_embeddings_embed_writes(ckpt, wavs, tmp_path, capsys):
    scp = write_scp(tmp_path / "wav.scp", [("b", wavs[1]), ("a", wavs[0])])
    out = tmp_path / "out" / "emb.npz"
    assert run_embed([str(scp), str(out), "--checkpoint", str(ckpt), "--device", "cpu", "--kaldi"]) == 0
    ids, emb = read_embeddings(out)
    assert ids == ["b", "a"] and emb.shape == (2, 16) and emb.dtype == np.float32  # wav.scp order
    import kaldiio  # a requirement of speakerlab (requirements.txt): never skipped

    ark = {k: v for k, v in kaldiio.load_scp(str(out.with_suffix(".scp"))).items()}
    assert list(ark) == ids and all(np.array_equal(ark[u], emb[i]) for i, u in enumerate(ids))
    capsys.readouterr()

    assert run_verify([wavs[0], wavs[1], "--checkpoint", str(ckpt), "--device", "cpu"]) == 0
    score, threshold, decision = parse_verify(capsys.readouterr().out)
    assert score == pytest.approx(cosine(emb[1], emb[0]), abs=2e-6)
    assert threshold == DEFAULT_THRESHOLD
    assert decision == ("same speaker" if score >= threshold else "different speakers")
    for t, want in ((score - 0.01, "same speaker"), (score + 0.01, "different speakers")):
        assert run_verify([wavs[0], wavs[1], "--checkpoint", str(ckpt), "--threshold", str(t)]) == 0
        assert parse_verify(capsys.readouterr().out)[1:] == (pytest.approx(t, abs=1e-6), want)


def test_ark_output_writes_ark_scp_and_npz(ckpt, wavs, tmp_path):
    noise = 0.1 * np.random.default_rng(5).standard_normal(400 + (MIN_FRAMES - 1) * 160)
    shortest = write_wav(tmp_path / "shortest.wav", noise)  # exactly MIN_FRAMES fbank frames: accepted
    scp = write_scp(tmp_path / "wav.scp", [("x", wavs[2]), ("y", shortest)])
    assert run_embed([str(scp), str(tmp_path / "k" / "e.ark"), "--checkpoint", str(ckpt)]) == 0
    assert sorted(p.name for p in (tmp_path / "k").iterdir()) == ["e.ark", "e.npz", "e.scp"]
    import kaldiio  # a requirement of speakerlab (requirements.txt): never skipped

    ark, (ids, emb) = kaldiio.load_scp(str(tmp_path / "k" / "e.scp")), read_embeddings(tmp_path / "k" / "e.npz")
    assert ids == ["x", "y"] and np.isfinite(emb).all()
    for i, u in enumerate(ids):
        np.testing.assert_array_equal(ark[u], emb[i])


def test_3dspeaker_state_dict(tmp_path, capsys):
    """A 3D-Speaker ResNet34 state dict (16 kHz features) on a 16 kHz and an 8 kHz file (short: a full-size model)."""
    rng = np.random.default_rng(4)
    wavs = [
        str(write_wav(tmp_path / "a.wav", 0.1 * rng.standard_normal(8000))),
        str(write_wav(tmp_path / "b8k.wav", 0.1 * rng.standard_normal(4800), sample_rate=8000)),
    ]
    torch.manual_seed(0)
    weights = tmp_path / "pretrained.bin"
    torch.save(build_model("resnet34").state_dict(), weights)
    model = ["--3dspeaker", "resnet34", "--weights", str(weights), "--device", "cpu"]
    scp = write_scp(tmp_path / "wav.scp", [("a", wavs[0]), ("b", wavs[1])])
    assert run_embed([str(scp), str(tmp_path / "e.npz"), *model]) == 0
    _, emb = read_embeddings(tmp_path / "e.npz")
    assert emb.shape == (2, 192)
    capsys.readouterr()
    assert run_verify([wavs[0], wavs[1], *model]) == 0
    assert parse_verify(capsys.readouterr().out)[0] == pytest.approx(cosine(emb[0], emb[1]), abs=2e-6)


def test_two_channel_file_embeds_its_first_channel_with_a_warning(ckpt, tmp_path, capsys):
    rng = np.random.default_rng(2)
    stereo = (0.1 * rng.standard_normal((20000, 2))).astype(np.float32)
    two = write_wav(tmp_path / "two.wav", stereo, subtype="FLOAT")
    first = write_wav(tmp_path / "first.wav", stereo[:, 0], subtype="FLOAT")
    scp = write_scp(tmp_path / "wav.scp", [("two", two), ("first", first)])
    assert run_embed([str(scp), str(tmp_path / "e.npz"), "--checkpoint", str(ckpt)]) == 0
    assert f"warning: {scp}:1: two: {two}: 2 channels, using the first" in capsys.readouterr().err
    _, emb = read_embeddings(tmp_path / "e.npz")
    np.testing.assert_allclose(emb[0], emb[1], rtol=1e-5, atol=1e-6)  # batched together: float rounding
    assert run_verify([str(two), str(first), "--checkpoint", str(ckpt)]) == 0
    out = capsys.readouterr()
    assert f"warning: {two}: 2 channels, using the first" in out.err
    assert parse_verify(out.out)[0] == pytest.approx(1.0, abs=1e-6)


def brute_force_eer_threshold(scores: np.ndarray, labels: np.ndarray) -> float:
    """Every distinct score t as 'target iff score >= t'; the t with the smallest |P_miss - P_fa|, the lowest
    on a tie."""
    tar, non = scores[labels], scores[~labels]
    best_t, best = None, np.inf
    for t in sorted(set(scores.tolist())):
        gap = abs(np.mean(tar < t) - np.mean(non >= t))
        if gap < best:
            best_t, best = t, gap
    return best_t


@pytest.mark.parametrize("seed", range(4))
def test_eer_threshold_is_where_miss_and_false_alarm_rates_cross(seed):
    rng = np.random.default_rng(seed)
    n_tar, n_non = int(rng.integers(5, 60)), int(rng.integers(5, 200))
    labels = np.r_[np.ones(n_tar, bool), np.zeros(n_non, bool)]
    scores = np.round(np.r_[rng.normal(0.6, 0.2, n_tar), rng.normal(0.2, 0.2, n_non)], 2)  # ties too
    t, p_miss, p_fa = eer_threshold(scores, labels)
    assert t == brute_force_eer_threshold(scores, labels)
    assert p_miss == np.mean(scores[labels] < t) and p_fa == np.mean(scores[~labels] >= t)


def test_verify_uses_the_calibration_lists_eer_threshold(ckpt, wavs, tmp_path, capsys):
    rng = np.random.default_rng(3)
    spk = rng.standard_normal((5, 16))
    ids = [f"s{i // 4}_{i % 4}" for i in range(20)]
    emb = (spk[np.arange(20) // 4] + 0.8 * rng.standard_normal((20, 16))).astype(np.float32)
    np.savez(tmp_path / "cal.npz", ids=np.asarray(ids), embeddings=emb)
    pairs = [(i, j) for i in range(20) for j in range(i + 1, 20)]
    (tmp_path / "trials").write_text(
        "".join(f"{ids[i]} {ids[j]} {'target' if i // 4 == j // 4 else 'nontarget'}\n" for i, j in pairs)
    )
    scores = np.array([cosine(emb[i], emb[j]) for i, j in pairs], np.float32)
    labels = np.array([i // 4 == j // 4 for i, j in pairs])
    want = brute_force_eer_threshold(scores, labels)
    assert (
        run_verify(
            [
                wavs[0],
                wavs[1],
                "--checkpoint",
                str(ckpt),
                "--calibration",
                str(tmp_path / "trials"),
                "--calibration-embeddings",
                str(tmp_path / "cal.npz"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    score, threshold, decision = parse_verify(out)
    assert threshold == pytest.approx(want, abs=1e-5) and f"EER threshold of {tmp_path / 'trials'}" in out
    assert decision == ("same speaker" if score >= threshold else "different speakers")


def test_bad_inputs_exit_2_naming_the_file(ckpt, wavs, tmp_path, capsys):
    model = ["--checkpoint", str(ckpt), "--device", "cpu"]

    def fails(run, argv, *names):
        try:
            code = run(argv)
        except SystemExit as e:  # argparse's own errors (usage) exit 2 from the parser
            code = e.code
        assert code == 2
        err = capsys.readouterr().err
        for name in names:
            assert str(name) in err, (name, err)

    missing, text = tmp_path / "missing.wav", tmp_path / "notes.wav"
    text.write_text("not audio\n")
    short = write_wav(tmp_path / "short.wav", 0.1 * np.ones(400 + (MIN_FRAMES - 1) * 160 - 1))  # one frame short
    nan = write_wav(tmp_path / "nan.wav", np.full(16000, np.nan, np.float32), subtype="FLOAT")
    fails(run_verify, [wavs[0], str(missing), *model], missing)
    fails(run_verify, [str(text), wavs[0], *model], text)
    fails(
        run_verify,
        [str(short), wavs[0], *model],
        short,
        "too short for an embedding: 1839 samples (0.115 s) at 16000 Hz, this model's shortest input is 1840 (0.115 s)",
    )
    fails(run_verify, [wavs[0], str(nan), *model], nan, "non-finite")
    fails(run_verify, [*wavs[:2], "--checkpoint", str(tmp_path / "nothing.pt")], tmp_path / "nothing.pt")
    torch.save({"not": torch.zeros(1)}, tmp_path / "w.bin")
    fails(run_verify, [*wavs[:2], "--3dspeaker", "resnet34", "--weights", str(tmp_path / "w.bin")], tmp_path / "w.bin")
    fails(run_verify, [*wavs[:2], "--3dspeaker", "resnet34"], "--3dspeaker needs --weights")
    fails(run_verify, [*wavs[:2], *model, "--calibration", "t"], "go together")
    # Calibration embeddings of another model (dimension 8), and a trial id without an embedding.
    np.savez(tmp_path / "cal8.npz", ids=np.asarray(["a", "b"]), embeddings=np.ones((2, 8), np.float32))
    (tmp_path / "trials").write_text("a b target\na c nontarget\n")
    fails(
        run_verify,
        [
            *wavs[:2],
            *model,
            "--calibration",
            str(tmp_path / "trials"),
            "--calibration-embeddings",
            str(tmp_path / "cal8.npz"),
        ],
        tmp_path / "cal8.npz",
    )
    np.savez(tmp_path / "cal16.npz", ids=np.asarray(["a", "b"]), embeddings=np.ones((2, 16), np.float32))
    fails(
        run_verify,
        [
            *wavs[:2],
            *model,
            "--calibration",
            str(tmp_path / "trials"),
            "--calibration-embeddings",
            str(tmp_path / "cal16.npz"),
        ],
        f"{tmp_path / 'trials'}:2",
    )

    out = tmp_path / "o" / "e.npz"
    scp = write_scp(tmp_path / "wav.scp", [("a", wavs[0]), ("gone", missing)])
    fails(run_embed, [str(scp), str(out), *model], f"{scp}:2: gone: {missing}")
    (tmp_path / "bad.scp").write_text(f"a {wavs[0]}\nb\n")
    fails(run_embed, [str(tmp_path / "bad.scp"), str(out), *model], f"{tmp_path / 'bad.scp'}:2")
    scp = write_scp(tmp_path / "nan.scp", [("a", wavs[0]), ("n", nan)])
    fails(run_embed, [str(scp), str(out), *model], f"{scp}:2: n: {nan}", "non-finite")
    fails(run_embed, [str(tmp_path / "wav.scp"), str(tmp_path / "e.txt"), *model], tmp_path / "e.txt")
    fails(run_embed, [str(tmp_path / "none.scp"), str(out), *model], tmp_path / "none.scp")
    assert not out.parent.exists()  # nothing written by a failed run
    # OUT.ark's scp is the wav.scp read: refused before any work, the wav.scp kept
    scp = write_scp(tmp_path / "o.scp", [("a", wavs[0])])
    before = scp.read_text()
    fails(run_embed, [str(scp), str(tmp_path / "o.ark"), *model], f"{scp}: an input of this command")
    assert scp.read_text() == before and not (tmp_path / "o.npz").exists()


def test_verify_uses_the_scoring_stages_threshold_of_this_very_checkpoint(ckpt, tmp_path, capsys):
    """`--checkpoint EXP` after a recipe's stages 4-5 (extract, score): the EER threshold scored on that
    checkpoint's embeddings, saying where it came from; for a checkpoint those scores are not of (a newer one),
    the untuned default, saying so and how to get a threshold."""
    from speakerlab.inference.extract import main as extract_main
    from speakerlab.scoring.score import main as score_main
    from tests.helpers import make_data_dir, save_tiny_checkpoint

    exp = tmp_path / "exp"
    (exp / "checkpoints").mkdir(parents=True)
    shutil.copy(ckpt, exp / "checkpoints" / "epoch_001.pt")
    data = make_data_dir(tmp_path / "test", {f"s{s}-{u}": f"s{s}" for s in range(3) for u in range(2)}, seconds=1.0)
    (data / "trials").write_text("s0-0 s0-1 target\ns1-0 s1-1 target\ns0-0 s1-0 nontarget\ns1-1 s2-0 nontarget\n")
    emb = exp / "embeddings" / "test.npz"
    assert extract_main(["--checkpoint", str(exp), "--data", str(data), "--out", str(emb), "--device", "cpu"]) == 0
    assert (
        score_main(
            [
                "--embeddings",
                str(emb),
                "--trials",
                str(data / "trials"),
                "--out",
                str(exp / "scores" / "test"),
                "--no-plots",
            ]
        )
        == 0
    )
    want = json.loads((exp / "scores" / "test.json").read_text())["operating_points"]["eer"]["threshold"]
    capsys.readouterr()
    a, b = str(data / "wav" / "s0-0.wav"), str(data / "wav" / "s2-1.wav")
    for given in (exp, exp / "checkpoints" / "epoch_001.pt"):
        assert run_verify([a, b, "--checkpoint", str(given), "--device", "cpu"]) == 0
        out = capsys.readouterr().out
        assert parse_verify(out)[1] == pytest.approx(want, abs=1e-6)
        assert f"(EER threshold of {exp / 'scores' / 'test.json'}: {data / 'trials'}, 4 trials, EER " in out
    # Training went on: the newest checkpoint has other weights, and no scores of its own.
    save_tiny_checkpoint(exp / "checkpoints" / "epoch_002.pt", seed=1)
    assert run_verify([a, b, "--checkpoint", str(exp), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert parse_verify(out)[1] == DEFAULT_THRESHOLD
    assert "(uncalibrated default, not tuned for this model: give --threshold T or --calibration TRIALS" in out
    assert "or score a trial list with this checkpoint (a recipe's stages 4-5)" in out


def test_every_console_script_help_documents_every_option_with_its_default(monkeypatch, capsys):
    """`--help` of each script of pyproject.toml (and of each sub-command): exit 0, the shared CommandParser
    (defaults shown), a description that does not end in ':', help text for every option and sub-command."""
    import argparse

    from speakerlab.commands import CommandParser, HelpFormatter

    tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    printed = []
    monkeypatch.setattr(CommandParser, "print_help", lambda self, file=None: printed.append(self))

    def helped(entry, argv) -> CommandParser:
        printed.clear()
        with pytest.raises(SystemExit) as e:
            sys.exit(entry(argv))
        assert e.value.code == 0 and len(printed) == 1, (argv, e.value.code, "not a CommandParser?")
        return printed[0]

    problems, seen = [], 0
    for name, target in scripts.items():
        module, func = target.split(":")
        entry = getattr(importlib.import_module(module), func)
        todo = [[]]
        while todo:
            argv = todo.pop()
            parser = helped(entry, [*argv, "--help"])
            seen += 1
            where = " ".join([name, *argv])
            assert parser.formatter_class is HelpFormatter, where
            if not (parser.description or "").strip() or parser.description.strip().endswith(":"):
                problems.append(f"{where}: description {parser.description!r}")
            for action in parser._actions:
                if isinstance(action, argparse._HelpAction):
                    continue
                if isinstance(action, argparse._SubParsersAction):
                    todo += [[*argv, choice.dest] for choice in action._choices_actions]
                    problems += [f"{where} {c.dest}: no help" for c in action._choices_actions if not c.help]
                elif not action.help or action.help == argparse.SUPPRESS:
                    problems.append(f"{where} {'/'.join(action.option_strings) or action.dest}: no help")
    assert not problems, "\n".join(problems)
    assert seen > len(scripts)  # the sub-commands of the corpus scripts too
    monkeypatch.undo()
    with pytest.raises(SystemExit):
        importlib.import_module("speakerlab.datasets.folder.cli").main(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "trials of test/trials and val/trials, half target (default: 20000)" in shown


def test_a_text_file_as_3dspeaker_weights_is_one_line_without_torchs_advice(wavs, tmp_path, capsys):
    """What torch.load(weights_only=True) refuses is said as what the file is; torch's own advice to load it
    with weights_only=False (running code from the file) is never passed on."""
    notes = tmp_path / "campplus_cn_common.bin"
    notes.write_text("<html>404 Not Found</html>\n")  # a download that went wrong
    pickled = tmp_path / "pickled.bin"
    torch.save({"state_dict": {"scale": Fraction(1, 3)}}, pickled)  # loading it would need a class from the file
    for weights, what in (
        (notes, "it is a text file, not a PyTorch weights file (torch.save writes a zip archive or a pickle)"),
        (pickled, "it holds Python objects (fractions.Fraction), not only weights; speakerlab reads weights only"),
    ):
        assert run_verify([*wavs[:2], "--3dspeaker", "campplus", "--weights", str(weights), "--device", "cpu"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: checkpoint {weights} cannot be loaded: {what}") and err.count("\n") == 1
        assert "weights_only" not in err
