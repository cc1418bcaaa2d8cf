"""speakerlab-stress: each row is the EER of the trial list with the named side degraded, with its counts and
interval; a too-short degraded or raw input is one error line."""

import json

import numpy as np
import pytest

from speakerlab.dataio.waveform.degrade import degrade, rng_for
from speakerlab.inference.embedder import load_embedder
from speakerlab.inference.stress import run
from speakerlab.scoring.metrics import compute_eer
from tests.helpers import write_wav
from tests.test_augment import bank_of, lists  # noqa: F401 (the lists fixture)

SR = 16000


def voice(spk: int, utt: int, seconds: float) -> np.ndarray:
    """A speaker's voiced sound: pitch and spectral tilt set by the speaker, the rest by the utterance."""
    rng = np.random.default_rng([spk, utt])
    t = np.arange(int(seconds * SR)) / SR
    f0 = 100 + 25 * spk + 5 * np.sin(2 * np.pi * (0.5 + utt) * t)
    phase = 2 * np.pi * np.cumsum(f0) / SR
    x = sum(np.sin(k * phase) * np.exp(-k / (5 + 3 * spk)) for k in range(1, 40)) + 0.05 * rng.standard_normal(t.size)
    return 0.2 * x / np.max(np.abs(x))


@pytest.fixture
def data(tmp_path):
    """6 speakers x 3 utterances of 1.5 s; trials: utterance 0 of each speaker against utterances 1, 2 of all."""
    root = tmp_path / "test"
    scp, u2s = [], []
    for s in range(6):
        for u in range(3):
            scp.append(f"s{s}-{u} {write_wav(root / 'wav' / f's{s}-{u}.wav', voice(s, u, 1.5))}\n")
            u2s.append(f"s{s}-{u} s{s}\n")
    (root / "wav.scp").write_text("".join(scp))
    (root / "utt2spk").write_text("".join(u2s))
    trials = [
        f"s{a}-0 s{b}-{u} {'target' if a == b else 'nontarget'}" for a in range(6) for b in range(6) for u in (1, 2)
    ]
    (root / "trials").write_text("\n".join(trials) + "\n")
    return root


def expected_eer(embedder, data, condition, both, bank=None, seed=0):
    """The EER computed here, without the command: enrol clean (or degraded), test degraded."""
    lines = [line.split() for line in (data / "trials").read_text().splitlines()]
    wav = dict(line.split() for line in (data / "wav.scp").read_text().splitlines())

    def emb(utt, degraded):
        x = embedder.read(wav[utt])
        if degraded and condition != "clean":
            x = degrade(x, SR, condition, rng_for(utt, condition, seed), bank)
        e = embedder.embed_waves([x])[0]
        return e / np.linalg.norm(e)

    scores = [float(emb(a, both) @ emb(b, True)) for a, b, _ in lines]
    return compute_eer(np.array(scores), np.array([t == "target" for _, _, t in lines]))


def test_rows_are_the_eers_of_the_degraded_side_with_counts_and_interval(ckpt, data, lists, tmp_path, capsys):  # noqa: F811
    bank = bank_of(lists)
    out, js = tmp_path / "stress.md", tmp_path / "stress.json"
    common = ["--checkpoint", str(ckpt), "--data", str(data), "--noise-bank", str(bank.root), "--ci-replicates", "200"]
    conditions = ["clean", "trunc1", "gsm", "noise5"]
    assert run([*common, "--conditions", *conditions, "--out", str(out), "--json", str(js)]) == 0
    rows = json.loads(js.read_text())["rows"]
    assert [r["condition"] for r in rows] == conditions
    embedder = load_embedder(ckpt, device="cpu")
    for r in rows:
        assert (r["n_trials"], r["n_target"], r["n_nontarget"], r["n_speakers"]) == (72, 12, 60, 6)
        assert r["side"] == "test"
        assert r["eer_ci"]["low"] <= r["eer"] <= r["eer_ci"]["high"] and r["eer_ci"]["level"] == 0.95
        assert r["eer"] == pytest.approx(expected_eer(embedder, data, r["condition"], False, bank), abs=1e-6)
    assert [round(r["test_seconds"], 3) for r in rows] == [1.5, 1.0, 1.5, 1.5]
    table = out.read_text()
    assert table == capsys.readouterr().out and table.count("\n| ") == 4 and "Mean EER over the 3 degraded" in table
    # Both sides degraded: another EER, the one of degrading enrolment too.
    assert run([*common, "--conditions", "noise5", "--both-sides", "--json", str(js)]) == 0
    row = json.loads(js.read_text())["rows"][0]
    assert row["side"] == "both"
    assert row["eer"] == pytest.approx(expected_eer(embedder, data, "noise5", True, bank), abs=1e-6)


def test_too_short_input_and_bad_conditions_are_one_line_errors(ckpt, data, capsys):
    embedder = load_embedder(ckpt, device="cpu")
    need = embedder.min_samples
    # A crop below the model's shortest input: refused, naming the wav.scp line (of the first test-side
    # utterance: enrolment stays clean) and the condition.
    assert run(["--checkpoint", str(ckpt), "--data", str(data), "--conditions", f"trunc{(need - 1) / SR:.4f}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"error: {data / 'wav.scp'}:2: s0-1: under trunc") and f"shortest input is {need} (" in err
    assert run(["--checkpoint", str(ckpt), "--data", str(data), "--conditions", "noise5"]) == 2
    assert "needs noise audio" in capsys.readouterr().err
    assert run(["--checkpoint", str(ckpt), "--data", str(data), "--conditions", "gsm+tele"]) == 2
    assert "unknown step 'tele'" in capsys.readouterr().err
