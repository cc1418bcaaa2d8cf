"""speakerlab-stress: each row is the EER of the trial list with the named side degraded, with its counts and
interval; a too-short degraded or raw input is one error line."""

import functools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from speakerlab.dataio.tables.embeddings import write_embeddings
from speakerlab.dataio.tables.trials import IdIndex, read_trial_list
from speakerlab.dataio.waveform.degrade import degrade, rng_for
from speakerlab.inference.embedder import load_embedder
from speakerlab.inference.stress import keep_test_side, run
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

    @functools.cache  # an utterance's degradation is drawn from its own seed: once per utterance and side is exact
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


def test_outputs_are_checked_before_the_table_and_never_replace_an_input(ckpt, data, tmp_path, capsys):
    """--out the trial list (or --json a file of the data dir) replaced it with the table; a folder as --json was
    refused only after every condition had been embedded. Now one line naming it, before any condition runs."""
    trials = (data / "trials").read_bytes()
    (tmp_path / "folder").mkdir()
    common = ["--checkpoint", str(ckpt), "--data", str(data), "--conditions", "clean", "tel", "--ci-replicates", "0"]
    for option, said in (
        (["--out", str(data / "trials")], f"error: {data / 'trials'}: an input of this command"),
        (["--json", str(data / "wav.scp")], f"error: {data / 'wav.scp'}: an input of this command"),
        (["--json", str(tmp_path / "folder")], f"error: {tmp_path / 'folder'} is a folder, not a file"),
        (["--out", "-"], "error: '-' (standard output) is not an output this command can write"),
    ):
        assert run([*common, *option]) == 2
        err = capsys.readouterr().err
        assert err.startswith(said) and len(err.strip().splitlines()) == 1, err
    assert (data / "trials").read_bytes() == trials


def test_a_test_side_draw_keeps_exactly_the_trials_of_the_drawn_utterances(ckpt, data, tmp_path):
    js = tmp_path / "stress.json"
    common = ["--checkpoint", str(ckpt), "--data", str(data), "--conditions", "clean", "trunc1", "--json", str(js)]
    assert run([*common, "--test-utts", "4", "--ci-replicates", "100"]) == 0
    first = json.loads(js.read_text())
    assert (first["test_utts"], first["list_trials"]) == (4, 72)
    tl = read_trial_list(data / "trials", IdIndex([f"s{s}-{u}" for s in range(6) for u in range(3)]))
    kept = keep_test_side(tl, 4, 0)
    drawn = set(np.unique(kept.test).tolist())
    # Every trial of a drawn test utterance is kept (6 enrolment utterances each), no other one.
    assert len(drawn) == 4 and np.array_equal(kept.line, tl.line[np.isin(tl.test, list(drawn))])
    assert all(r["n_trials"] == 24 and r["n_target"] == int(kept.target.sum()) for r in first["rows"])
    # The clean row is the EER of the kept trials, computed here without the command.
    embedder = load_embedder(ckpt, device="cpu")
    wav = dict(line.split() for line in (data / "wav.scp").read_text().splitlines())
    ids = tl.index.ids
    unit = {u: (lambda e: e / np.linalg.norm(e))(embedder.embed_waves([embedder.read(wav[u])])[0]) for u in ids}
    scores = np.array([float(unit[ids[a]] @ unit[ids[b]]) for a, b in zip(kept.enrol, kept.test)])
    assert first["rows"][0]["eer"] == pytest.approx(compute_eer(scores, kept.target), abs=1e-6)
    # Seeded: the same draw and rows again; another seed draws other utterances.
    assert run([*common, "--test-utts", "4", "--ci-replicates", "100"]) == 0
    assert json.loads(js.read_text())["rows"] == first["rows"]
    assert set(np.unique(keep_test_side(tl, 4, 1).test).tolist()) != drawn
    # A draw of every test utterance is the whole list; a draw of none is refused.
    assert keep_test_side(tl, 12, 0) is tl
    assert run([*common, "--test-utts", "0"]) == 2


def test_clean_side_from_this_models_embeddings_gives_the_same_rows_and_another_models_is_refused(
    ckpt, data, tmp_path, capsys
):
    js = tmp_path / "stress.json"
    common = ["--checkpoint", str(ckpt), "--data", str(data), "--conditions", "clean", "trunc1", "--json", str(js)]
    assert run([*common, "--ci-replicates", "100"]) == 0
    computed = json.loads(js.read_text())["rows"]
    embedder = load_embedder(ckpt, device="cpu")
    wav = dict(line.split() for line in (data / "wav.scp").read_text().splitlines())
    ids = sorted(wav)
    emb = np.stack([embedder.embed_waves([embedder.read(wav[u])])[0] for u in ids]).astype(np.float32)
    npz = write_embeddings(tmp_path / "test.npz", ids, emb, model_id=embedder.model_id)
    assert run([*common, "--ci-replicates", "100", "--clean-embeddings", str(npz)]) == 0
    stored = json.loads(js.read_text())["rows"]
    assert [r["eer"] for r in stored] == pytest.approx([r["eer"] for r in computed], abs=1e-6)
    assert [r["test_seconds"] for r in stored] == pytest.approx([r["test_seconds"] for r in computed])
    # Another model's file, a file without an utterance of the list: one error line naming the file.
    other = write_embeddings(tmp_path / "other.npz", ids, emb, model_id="0" * 40)
    assert run([*common, "--clean-embeddings", str(other)]) == 2
    assert f"{other}: made by model {'0' * 40}, not this model" in capsys.readouterr().err
    part = write_embeddings(tmp_path / "part.npz", ids[1:], emb[1:], model_id=embedder.model_id)
    assert run([*common, "--clean-embeddings", str(part)]) == 2
    assert f"{part}: no embedding of '{ids[0]}'" in capsys.readouterr().err
    assert run([*common, "--clean-embeddings", str(tmp_path / "none.npz")]) == 2
    assert f"{tmp_path / 'none.npz'}: embeddings file does not exist" in capsys.readouterr().err


def test_the_side_by_side_script_refuses_tables_of_different_test_side_draws(tmp_path):
    def table(path, eers, test_utts):
        rows = [{"condition": c, "eer": e, "test_seconds": 6.0, "n_trials": 10, "side": "test"} for c, e in eers]
        head = {"trials": "data/test/trials", "seed": 0, "test_utts": test_utts, "list_trials": 30}
        path.write_text(json.dumps({**head, "rows": rows}))
        return str(path)

    script = [sys.executable, str(Path(__file__).parents[1] / "bench" / "stress_compare.py")]
    base = table(tmp_path / "a.json", [("clean", 0.04), ("tel", 0.10), ("mp3", 0.20)], 200)
    other = table(tmp_path / "b.json", [("clean", 0.05), ("tel", 0.05), ("mp3", 0.10)], 200)
    out = subprocess.run([*script, base, other], capture_output=True, text=True)
    assert out.returncode == 0
    assert "mean EER over the 2 degraded conditions: first 15.00 %, second 7.50 %: -50.0 % relative" in out.stdout
    assert "clean +25.0 % relative" in out.stdout and "(10 of 30, test side a draw of 200)" in out.stdout
    drawn = table(tmp_path / "c.json", [("clean", 0.05), ("tel", 0.05), ("mp3", 0.10)], 100)
    out = subprocess.run([*script, base, drawn], capture_output=True, text=True)
    assert out.returncode == 2 and "test-side draw" in out.stderr


def test_a_noise_bank_folder_that_is_none_says_how_to_build_one(ckpt, data, tmp_path, capsys):
    """--noise-bank data/musan_rirs (the lists, not their bank/) was `error: [Errno 2] No such file or directory:
    '.../index.json'`; now it says the folder is no noise bank and what builds one."""
    folder = tmp_path / "musan_rirs"
    folder.mkdir()
    argv = ["--checkpoint", str(ckpt), "--data", str(data), "--conditions", "noise5", "--noise-bank", str(folder)]
    assert run(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: {folder}: not a noise bank (no index.json); build one with `speakerlab-noise-bank --lists "
        "DIR`, which writes DIR/bank"
    ]


def test_a_noise_bank_of_another_sample_rate_is_refused(ckpt, data, tmp_path, capsys):
    """An 8 kHz bank on a 16 kHz model's audio was used as it is (its noise at twice the speed); now refused."""
    from speakerlab.dataio.waveform.noise_bank import build_bank

    folder = tmp_path / "lists"
    wav = write_wav(folder / "n0.wav", 0.1 * np.random.default_rng(0).standard_normal(8000), sample_rate=8000)
    (folder / "noise.scp").write_text(f"n0 {wav}\n")
    build_bank(folder, folder / "bank", ["noise"], 8000, lambda m: None)
    argv = [
        "--checkpoint",
        str(ckpt),
        "--data",
        str(data),
        "--conditions",
        "noise5",
        "--noise-bank",
        str(folder / "bank"),
    ]
    assert run(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (
        f"error: {folder / 'bank'}: a noise bank of 8000 Hz audio, this model's is 16000 Hz: build one at that rate "
        "(speakerlab-noise-bank --sample-rate 16000)"
    )
