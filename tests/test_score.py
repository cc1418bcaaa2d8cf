"""The score command: outputs of several lists, the one-list form of before, pictures, bad inputs."""

import json
import math
import re

import numpy as np
import pytest

from speakerlab.dataio.tables.trials import IdIndex, TrialList
from speakerlab.inference.stress import run as stress_run
from speakerlab.scoring.calibrate import main as calibrate_main
from speakerlab.scoring.metrics import compute_eer, compute_min_dcf
from speakerlab.scoring.plots import HEIGHT, WIDTH
from speakerlab.scoring.report import write_scores
from speakerlab.scoring.score import main
from speakerlab.scoring.scorer import evaluate


def _case(tmp_path, n_spk=8, per_spk=4, dim=12, seed=0):
    """Embeddings of speakers (centre + noise), a cohort with utt2spk, durations, three trial lists."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_spk, dim))
    ids = [f"spk{s}/utt{u}" for s in range(n_spk) for u in range(per_spk)]
    emb = np.stack([centres[s] + 0.8 * rng.standard_normal(dim) for s in range(n_spk) for _ in range(per_spk)])
    np.savez(tmp_path / "emb.npz", ids=np.array(ids), embeddings=emb.astype(np.float32))
    c_ids = [f"c{s}-{u}" for s in range(10) for u in range(3)]
    np.savez(tmp_path / "cohort.npz", ids=np.array(c_ids), embeddings=rng.standard_normal((30, dim)).astype(np.float32))
    (tmp_path / "cohort_utt2spk").write_text("".join(f"{c} {c.split('-')[0]}\n" for c in c_ids))
    (tmp_path / "utt2dur").write_text("".join(f"{u} {rng.uniform(1, 9):.2f}\n" for u in ids))
    for k, name in enumerate(["A", "B", "C"]):
        (tmp_path / name).mkdir()
        pairs = sorted(
            {(int(a), int(b)) for a, b in np.random.default_rng(k).integers(0, len(ids), (120, 2)) if a != b}
        )
        text = "".join(
            f"{ids[a]} {ids[b]} {'target' if a // per_spk == b // per_spk else 'nontarget'}\n" for a, b in pairs
        )
        (tmp_path / name / "trials").write_text(text)
    return ids, emb


def _read_scores(path):
    rows = [line.split() for line in path.read_text().splitlines()]
    return rows, np.array([float(r[2]) for r in rows]), np.array([r[3] == "target" for r in rows])


def test_two_lists_round_trip(tmp_path, capsys):
    ids, emb = _case(tmp_path)
    out = tmp_path / "scores"
    args = [
        "--embeddings",
        str(tmp_path / "emb.npz"),
        "--trials",
        str(tmp_path / "A" / "trials"),
        str(tmp_path / "B" / "trials"),
        "--out",
        str(out),
    ]
    assert main(args) == 0
    printed = capsys.readouterr().out
    unit = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    pos = {u: i for i, u in enumerate(ids)}
    for name in ("A", "B"):  # file names repeat ("trials"): the parent directories name the lists
        rows, scores, labels = _read_scores(out / f"{name}.scores")
        want = [(tmp_path / name / "trials").read_text().split()[i::3] for i in range(3)]
        assert [r[0] for r in rows] == want[0] and [r[1] for r in rows] == want[1]
        assert [r[3] for r in rows] == want[2]
        cos = [float(unit[pos[r[0]]] @ unit[pos[r[1]]]) for r in rows]
        np.testing.assert_allclose(scores, cos, atol=1e-6)
        summary = json.loads((out / f"{name}.json").read_text())
        assert summary["n_trials"] == len(rows) and summary["n_target"] == int(labels.sum())
        assert summary["eer"] == pytest.approx(compute_eer(scores, labels), abs=1e-5)
        for p in ("0.01", "0.05"):
            assert summary["min_dcf"][p] == pytest.approx(compute_min_dcf(scores, labels, float(p)), abs=1e-5)
        points = summary["operating_points"]
        assert set(points) == {"eer", "fa=0.01", "fa=0.001"}
        for point in points.values():  # each threshold gives the rates it states, on the written scores
            t = point["threshold"]
            assert point["p_miss"] == pytest.approx(np.mean(scores[labels] < t - 5e-7), abs=2 / labels.sum())
            assert point["p_fa"] == pytest.approx(np.mean(scores[~labels] >= t - 5e-7), abs=2 / (~labels).sum())
        assert (out / f"{name}.result").read_text().strip() in printed
        for png in ("det", "hist"):
            assert (out / f"{name}.{png}.png").is_file()
    table = (out / "results.md").read_text()
    assert table in printed
    assert [line.split("|")[1].strip() for line in table.splitlines()[2:]] == ["A", "B"]


def test_one_list_prefix_form_as_before(tmp_path, capsys):
    _case(tmp_path)
    prefix = tmp_path / "exp" / "test"
    assert (
        main(
            [
                "--embeddings",
                str(tmp_path / "emb.npz"),
                "--trials",
                str(tmp_path / "A" / "trials"),
                "--out",
                str(prefix),
            ]
        )
        == 0
    )
    result = (tmp_path / "exp" / "test.result").read_text()
    assert re.match(
        r".*A/trials: \d+ trials \(\d+ target, \d+ nontarget, \d+ speakers\) "
        r"EER \d+\.\d\d% \(95% CI \d+\.\d\d-\d+\.\d\d%, threshold -?\d\.\d{4}\) "
        r"minDCF\(p_target=0.01\) \d\.\d{4}"
        r".* threshold\(FA 1%\) -?\d\.\d{4} \(miss \d+\.\d\d%\) threshold\(FA 0\.1%\) ",
        result,
    )
    assert (tmp_path / "exp" / "test.scores").is_file()
    assert (tmp_path / "exp" / "test.md").read_text().splitlines()[2].startswith("| test |")  # named by the prefix


def test_pictures_have_the_stated_size_and_are_not_blank(tmp_path):
    from matplotlib.image import imread

    _case(tmp_path)
    assert (
        main(
            [
                "--embeddings",
                str(tmp_path / "emb.npz"),
                "--trials",
                str(tmp_path / "A" / "trials"),
                "--out",
                str(tmp_path / "o"),
            ]
        )
        == 0
    )
    for png in ("det", "hist"):
        img = imread(tmp_path / f"o.{png}.png")
        assert img.shape[:2] == (HEIGHT, WIDTH)
        assert float(img[..., :3].var()) > 1e-3


def test_normalisation_and_qmf_options(tmp_path, capsys):
    _case(tmp_path)
    out = tmp_path / "norm"
    assert (
        main(
            [
                "--embeddings",
                str(tmp_path / "emb.npz"),
                "--trials",
                str(tmp_path / "A" / "trials"),
                str(tmp_path / "B" / "trials"),
                "--out",
                str(out),
                "--names",
                "a",
                "b",
                "--cohort",
                str(tmp_path / "cohort.npz"),
                "--cohort-utt2spk",
                str(tmp_path / "cohort_utt2spk"),
                "--mean-sub",
                "--asnorm-top-n",
                "5",
                "--qmf-train",
                str(tmp_path / "C" / "trials"),
                "--durations",
                str(tmp_path / "utt2dur"),
                "--no-plots",
            ]
        )
        == 0
    )
    summary = json.loads((out / "a.json").read_text())
    assert summary["scoring"]["method"] == "mean-sub+cosine+asnorm5+qmf"
    assert set(summary["scoring"]["qmf"]) == {"score", "logdur_min", "logdur_max", "norm_min", "norm_max", "bias"}
    assert math.isfinite(summary["cllr"]) and set(summary["act_dcf"]) == {"0.01", "0.05"}
    assert "Cllr" in (out / "results.md").read_text()
    assert not (out / "a.det.png").exists()


def test_evaluate_keeps_its_contract(tmp_path):
    ids, emb = _case(tmp_path)
    scores, labels, eer, dcf = evaluate(ids, emb, tmp_path / "A" / "trials")
    assert scores.shape == labels.shape and labels.dtype == bool
    assert eer == pytest.approx(compute_eer(scores, labels)) and dcf == pytest.approx(compute_min_dcf(scores, labels))


def test_scores_file_numbers(tmp_path):
    """The vectorised `%.6f` writer against Python's formatting, signs and large values included."""
    index = IdIndex(["a", "bb"])
    s = np.array([0.5, -0.25, 1234567.125, -3e-7, 0.0, -0.9999996, 12.3456789], np.float32)
    n = len(s)
    tl = TrialList(
        "t",
        index,
        np.zeros(n, np.int32),
        np.ones(n, np.int32),
        np.arange(n) % 2 == 0,
        np.arange(1, n + 1, dtype=np.int32),
    )
    rows, got, labels = _read_scores(write_scores(tmp_path / "s", tl, s))
    np.testing.assert_allclose(got, [float(f"{v:.6f}") for v in s.astype(np.float64)], atol=1.1e-6)
    assert [r[:2] for r in rows] == [["a", "bb"]] * n and labels.tolist() == (np.arange(n) % 2 == 0).tolist()
    s[1] = np.nan  # not finite: the plain formatter takes the block
    assert _read_scores(write_scores(tmp_path / "s", tl, s))[0][1][2] == "nan"


def _run_bad(tmp_path, capsys, trials_text=None, extra=()):
    _case(tmp_path)
    t = tmp_path / "bad_trials"
    if trials_text is not None:
        t.write_text(trials_text)
    code = main(["--embeddings", str(tmp_path / "emb.npz"), "--trials", str(t), "--out", str(tmp_path / "o"), *extra])
    return code, t, capsys.readouterr().err


def test_bad_missing_ids(tmp_path, capsys):
    code, t, err = _run_bad(
        tmp_path, capsys, "spk0/utt0 spk0/utt1 target\nspk0/utt0 ghost1 nontarget\nghost2 spk0/utt1 nontarget\n"
    )
    assert code == 2
    assert f"{t}:2: 'ghost1'" in err and f"{t}:3: 'ghost2'" in err and "2 trial line(s)" in err


def test_bad_empty_list(tmp_path, capsys):
    code, t, err = _run_bad(tmp_path, capsys, "")
    assert code == 2 and f"{t}: no trials" in err


def test_bad_one_class(tmp_path, capsys):
    code, t, err = _run_bad(tmp_path, capsys, "spk0/utt0 spk0/utt1 target\nspk1/utt0 spk1/utt1 target\n")
    assert code == 2 and f"{t}: all 2 trials are target" in err


def test_bad_malformed_line(tmp_path, capsys):
    code, t, err = _run_bad(tmp_path, capsys, "spk0/utt0 spk0/utt1 target\nspk0/utt0 spk1/utt1\n")
    assert code == 2 and f"{t}:2: expected 'enrol test target|nontarget'" in err


def test_bad_mixed_dimensions(tmp_path, capsys):
    _case(tmp_path)
    np.savez(tmp_path / "wide.npz", ids=np.array(["w0", "w1"]), embeddings=np.ones((2, 7), np.float32))
    code = main(
        [
            "--embeddings",
            str(tmp_path / "emb.npz"),
            "--trials",
            str(tmp_path / "A" / "trials"),
            "--out",
            str(tmp_path / "o"),
            "--cohort",
            str(tmp_path / "wide.npz"),
            "--mean-sub",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "emb.npz: embeddings of dimension 12 do not match the dimension 7 of" in err
    assert "wide.npz" in err


def test_bad_non_finite_embeddings(tmp_path, capsys):
    ids, emb = _case(tmp_path)
    emb[3, 1] = np.nan
    np.savez(tmp_path / "nan.npz", ids=np.array(ids), embeddings=emb.astype(np.float32))
    code = main(
        [
            "--embeddings",
            str(tmp_path / "nan.npz"),
            "--trials",
            str(tmp_path / "A" / "trials"),
            "--out",
            str(tmp_path / "o"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and f"{tmp_path / 'nan.npz'}: 1 embedding(s) are not finite, e.g. '{ids[3]}'" in err


def test_bad_output_over_an_input(tmp_path, capsys):
    """--table, or a file of an --out prefix, naming a file the command reads: one line naming it, the input kept."""
    ids, _ = _case(tmp_path)
    trials, utt2spk = tmp_path / "A" / "trials", tmp_path / "o.result"  # o.result: the prefix o's result file
    utt2spk.write_text("".join(f"{u} {u.split('/')[0]}\n" for u in ids))
    inputs = {p: p.read_text() for p in (trials, utt2spk)}
    base = ["--embeddings", str(tmp_path / "emb.npz"), "--trials", str(trials), "--no-plots"]
    for extra, victim in (
        (["--out", str(tmp_path / "s"), "--table", str(trials)], trials),
        (["--out", str(tmp_path / "o"), "--utt2spk", str(utt2spk)], utt2spk),
    ):
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert err == f"error: {victim}: an input of this command; writing an output there would replace it"
    assert {p: p.read_text() for p in inputs} == inputs and not list(tmp_path.glob("s.*"))
    # a folder as --table: one line before any scoring, not a traceback after it
    assert main([*base, "--out", str(tmp_path / "s"), "--table", str(tmp_path / "A")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {tmp_path / 'A'} is a folder, not a file: give the path of the file to write"
    assert not list(tmp_path.glob("s.*"))


def test_bad_cohort_or_qmf_embeddings_of_another_model(tmp_path, capsys):
    """--cohort or --qmf-embeddings recording another model than --embeddings: one line naming both, nothing
    written; files that record no model are scored as before."""
    from speakerlab.dataio.tables.embeddings import read_embeddings, write_embeddings

    _case(tmp_path)
    for name, model in (("emb", "a" * 64), ("cohort", "b" * 64), ("qmf", "b" * 64)):
        source = tmp_path / ("emb.npz" if name == "qmf" else f"{name}.npz")
        write_embeddings(tmp_path / f"{name}_m.npz", *read_embeddings(source), model_id=model)
    base = ["--embeddings", str(tmp_path / "emb_m.npz"), "--trials", str(tmp_path / "A" / "trials"), "--no-plots"]
    out = ["--out", str(tmp_path / "o")]
    for extra, other in (
        (["--cohort", str(tmp_path / "cohort_m.npz"), "--mean-sub"], "cohort_m.npz"),
        (["--qmf-train", str(tmp_path / "B" / "trials"), "--qmf-embeddings", str(tmp_path / "qmf_m.npz")], "qmf_m.npz"),
    ):
        assert main([*base, *out, *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{tmp_path / other}: embeddings of model bbbbbbbbbbbb" in err[0], err
        assert f"{tmp_path / 'emb_m.npz'}: of aaaaaaaaaaaa" in err[0] and not list(tmp_path.glob("o.*"))
    assert main([*base, *out, "--cohort", str(tmp_path / "cohort.npz"), "--mean-sub"]) == 0  # no model recorded


def test_bad_arguments_exit_2(tmp_path, capsys):
    _case(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["--embeddings", str(tmp_path / "emb.npz"), "--trials", "a", "b", "c", "--out", "x", "y"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        main(["--embeddings", "e", "--trials", "a", "--out", "x", "--asnorm-top-n", "3"])
    assert e.value.code == 2


def test_scoring_side_imports_no_training_code():
    import subprocess
    import sys

    code = (
        "import sys, speakerlab.scoring.score, speakerlab.scoring.metrics, speakerlab.scoring.plots;"
        "bad = [m for m in sys.modules if m.startswith(('speakerlab.train', 'speakerlab.train.loop', 'torch'))];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _score(tmp_path, *extra, trials="A"):
    args = ["--embeddings", str(tmp_path / "emb.npz"), "--trials", str(tmp_path / trials / "trials")]
    return main([*args, "--out", str(tmp_path / "o" / trials), "--no-plots", *extra])


def test_counts_and_the_eer_interval_in_json_text_and_table_with_a_warning_when_too_few(tmp_path, capsys):
    """8 speakers (from the utt2spk beside the list): counts and interval in every output, and one warning line
    naming what the list lacks."""
    ids, _ = _case(tmp_path)
    (tmp_path / "A" / "utt2spk").write_text("".join(f"{u} {u.split('/')[0]}\n" for u in ids))
    assert _score(tmp_path) == 0
    out, err = capsys.readouterr()
    s = json.loads((tmp_path / "o" / "A.json").read_text())
    assert (s["n_speakers"], s["speakers_from"]) == (8, str(tmp_path / "A" / "utt2spk"))
    assert s["n_target"] + s["n_nontarget"] == s["n_trials"] and s["n_target"] > 0
    ci = s["eer_ci"]
    assert ci["level"] == 0.95 and ci["replicates"] == 1000 and ci["trials_used"] == s["n_trials"]
    assert 0 <= ci["low"] < s["eer"] < ci["high"] <= 1 and ci["method"].startswith("speaker bootstrap")
    counts = f"{s['n_trials']} trials ({s['n_target']} target, {s['n_nontarget']} nontarget, 8 speakers)"
    interval = f"95% CI {ci['low'] * 100:.2f}-{ci['high'] * 100:.2f}%"
    line = (tmp_path / "o" / "A.result").read_text().strip()
    assert line.startswith(f"{tmp_path / 'A' / 'trials'}: {counts} EER {s['eer'] * 100:.2f}% ({interval}, threshold ")
    assert line in out
    assert f"| {s['eer'] * 100:.2f} | {interval[7:-1]} | 8 |" in out  # the table's EER, interval, speakers
    lacking = f"too few to tell models apart by the EER: 8 speakers (20 needed), {s['n_target']} target trials (600"
    assert s["warning"].startswith(f"{tmp_path / 'A' / 'trials'}: {lacking}")
    assert err == f"warning: {s['warning']}: EER {s['eer'] * 100:.2f}% ({interval})\n"


def test_no_warning_when_the_list_is_large_enough_and_no_interval_when_asked(tmp_path, capsys):
    rng = np.random.default_rng(1)
    ids = [f"s{s}-{u}" for s in range(24) for u in range(12)]
    centres = rng.standard_normal((24, 16))
    emb = np.stack([centres[int(i[1:].split("-")[0])] + 0.9 * rng.standard_normal(16) for i in ids])
    np.savez(tmp_path / "emb.npz", ids=np.array(ids), embeddings=emb.astype(np.float32))
    pairs = [(a, b) for a in range(len(ids)) for b in range(a + 1, len(ids))]
    tar = [p for p in pairs if p[0] // 12 == p[1] // 12]
    non = [pairs[i] for i in rng.choice(len(pairs), 1600, replace=False) if pairs[i][0] // 12 != pairs[i][1] // 12]
    (tmp_path / "L").mkdir()
    rows = sorted([(a, b, "target") for a, b in tar] + [(a, b, "nontarget") for a, b in non])
    (tmp_path / "L" / "trials").write_text("".join(f"{ids[a]} {ids[b]} {lab}\n" for a, b, lab in rows))
    assert _score(tmp_path, trials="L") == 0
    out, err = capsys.readouterr()
    s = json.loads((tmp_path / "o" / "L.json").read_text())
    assert (s["n_target"], s["n_speakers"], s["speakers_from"]) == (24 * 66, 24, "target trials")
    assert "warning" not in s and err == "" and s["eer_ci"]["low"] <= s["eer"] <= s["eer_ci"]["high"]
    assert _score(tmp_path, "--ci-replicates", "0", trials="L") == 0
    s = json.loads((tmp_path / "o" / "L.json").read_text())
    assert s["eer_ci"] is None and "CI" not in (tmp_path / "o" / "L.result").read_text()


def test_a_given_utt2spk_must_name_every_utterance(tmp_path, capsys):
    ids, _ = _case(tmp_path)
    (tmp_path / "spk").write_text(f"{ids[0]} spk0\n")
    assert _score(tmp_path, "--utt2spk", str(tmp_path / "spk")) == 2
    assert f"error: {tmp_path / 'spk'}: no speaker for '" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        _score(tmp_path, "--ci-level", "95")
    assert e.value.code == 2 and "--ci-level must lie in (0, 1), got 95" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, least",
    [
        (["--ci-replicates", "1"], 40),
        (["--ci-replicates", "39"], 40),
        (["--ci-level", "0.99", "--ci-replicates", "100"], 200),
    ],
)
def test_too_few_replicates_for_the_level_are_refused(tmp_path, capsys, args, least):
    """With fewer than 2 / (1 - level) replicates an end of the interval is the most extreme replicate whatever the
    level: one replicate gave a "95% CI" of 2.44-5.00% around an EER of 5.00%. Refused before any work, naming the
    least count; speakerlab-stress and speakerlab-calibrate share the rule."""
    _case(tmp_path)
    with pytest.raises(SystemExit) as e:
        _score(tmp_path, *args)
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"--ci-replicates must be 0 (no interval) or at least {least}" in err, err
    assert not (tmp_path / "o").exists()
    assert _score(tmp_path, "--ci-replicates", "40") == 0
    with pytest.raises(SystemExit) as e:
        calibrate_main(["--trials", "t", "--embeddings", "e.npz", "--out", "c.json", "--ci-replicates", "5"])
    assert e.value.code == 2 and "at least 40 for a 0.95 interval, got 5" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        stress_run(["--checkpoint", "c", "--data", "d", "--ci-replicates", "5"])
    assert e.value.code == 2 and "at least 40 for a 0.95 interval, got 5" in capsys.readouterr().err
