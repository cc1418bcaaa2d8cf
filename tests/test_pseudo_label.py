"""speakerlab-pseudo-label: clusters of embeddings -> a labelled data dir, the confidence rule, purity and NMI."""

import numpy as np
import pytest

from speakerlab.dataio.tables.compact import read_compact
from speakerlab.dataio.tables.embeddings import write_embeddings
from speakerlab.dataio.tables.lists import load_data_dir, read_table, write_table
from speakerlab.train.pseudo_label import keep_confident, main, purity


def corpus(tmp_path, speakers=8, utts=10, spread=0.15, seed=0, dim=16):
    """A wav.scp (paths need not exist) and embeddings: speaker s's utterances scattered around a direction of
    its own, plus `ambiguous` utterances halfway between speakers 0 and 1."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((speakers, dim))
    ids, emb, truth = [], [], []
    for s in range(speakers):
        for u in range(utts):
            ids.append(f"s{s}-{u}")
            emb.append(centres[s] + spread * np.linalg.norm(centres[s]) * rng.standard_normal(dim) / 4)
            truth.append(f"s{s}")
    for u in range(4):  # between speakers 0 and 1: the least confident
        ids.append(f"s0-x{u}")
        emb.append((centres[0] / np.linalg.norm(centres[0]) + centres[1] / np.linalg.norm(centres[1])) / 2)
        truth.append("s0")
    data = tmp_path / "data"
    data.mkdir()
    order = np.argsort(ids)
    (data / "wav.scp").write_text("".join(f"{ids[i]} /audio/{ids[i]}.wav\n" for i in order))
    (tmp_path / "utt2spk").write_text("".join(f"{ids[i]} {truth[i]}\n" for i in order))
    write_embeddings(tmp_path / "emb.npz", ids, np.array(emb, dtype=np.float32))
    return data


def test_clusters_become_a_labelled_data_dir_and_the_unsure_are_dropped(tmp_path, capsys):
    data = corpus(tmp_path)
    out = tmp_path / "pl"
    args = ["--embeddings", str(tmp_path / "emb.npz"), "--data", str(data), "--out", str(out)]
    assert main(args + ["--clusters", "8", "--drop", "0.05", "--true-labels", str(tmp_path / "utt2spk")]) == 0
    printed = capsys.readouterr()
    assert "pseudo-label: 80 of 84 utterances kept in 8 clusters" in printed.err
    assert "kept: 80 utterances, 8 true speakers in 8 clusters: purity 100.00%, NMI 1.0000" in printed.out
    labelled = load_data_dir(out)
    assert not any("-x" in u for u in labelled.utts)  # the 4 between two speakers are the 5% dropped
    groups = {}
    for u, c in labelled.utt2spk.items():
        groups.setdefault(c, set()).add(u.split("-")[0])
    assert sorted(len(g) for g in groups.values()) == [1] * 8  # one true speaker per cluster
    assert labelled.wav["s3-1"] == "/audio/s3-1.wav"
    # The count estimated by AHC on the same embeddings
    assert main(args + ["--estimate", "--threshold", "0.3", "--drop", "0"]) == 0
    assert "84 of 84 utterances kept in 8 clusters" in capsys.readouterr().err


def test_labels_written_again_over_an_earlier_round_leave_nothing_that_disagrees(tmp_path):
    """A second round (another start, count or drop) into the same --out: the index and training's cached lists
    of the first (utt2num_samples, .compact) must not survive it, nor a spk2utt of its clusters (a recipe rerun
    from another model stopped at speakerlab-prepare on that: 'under speaker pl000000 but utt2spk says ...')."""
    data = corpus(tmp_path)
    out = tmp_path / "pl"
    args = ["--embeddings", str(tmp_path / "emb.npz"), "--data", str(data), "--out", str(out)]
    assert main(args + ["--clusters", "8", "--drop", "0.05"]) == 0
    write_table(out / "utt2num_samples", [(u, 16000) for u in load_data_dir(out).utts])  # what prepare adds
    assert len(read_compact(out).speakers) == 8 and (out / ".compact").is_dir()
    assert main(args + ["--clusters", "4", "--drop", "0"]) == 0
    labelled = load_data_dir(out)  # checks spk2utt against utt2spk
    assert len(labelled.utts) == 84 and len(set(labelled.utt2spk.values())) == 4
    assert not (out / "utt2num_samples").exists()  # the prepare stage indexes the 84 anew
    groups = {}
    for u, c in labelled.utt2spk.items():
        groups.setdefault(c, []).append(u)
    spk2utt = read_table(out / "spk2utt", max_fields=None)
    assert {c: sorted(fields) for c, (_, fields) in spk2utt.items()} == {c: sorted(g) for c, g in groups.items()}
    lists = read_compact(out)  # training's view: the new clusters, not the cache of the old
    assert len(lists) == 84 and len(lists.speakers) == 4


def test_the_estimated_count_is_scaled_from_the_sample_to_the_whole_set(tmp_path, capsys):
    """300 speakers of 40 utterances, AHC on a random 600 of the 12,004: the sample holds about 259 of the speakers
    (300 (1 - e^-2)), and the count for the whole set is scaled back up to about 300."""
    from speakerlab.train.pseudo_label import whole_set_count

    assert whole_set_count(3391, 5000, 1_000_000) in range(5900, 6050)  # 6 k speakers at VoxCeleb2 scale
    assert whole_set_count(8, 84, 84) == 8  # the whole set clustered: nothing to scale
    data = corpus(tmp_path, speakers=300, utts=40, spread=0.1, dim=64)  # 64-D: no two speakers within the cut
    args = ["--embeddings", str(tmp_path / "emb.npz"), "--data", str(data), "--out", str(tmp_path / "pl")]
    assert main(args + ["--estimate", "--estimate-sample", "600", "--threshold", "0.3", "--drop", "0"]) == 0
    found, scaled = (int(w) for w in capsys.readouterr().err.split("AHC found ")[1].split()[:8:7])
    assert 240 <= found <= 275 and 270 <= scaled <= 330, (found, scaled)  # within 10 % of 300
    tiny = ["--estimate", "--estimate-sample", "40", "--threshold", "0.01"]  # nearly every utterance its own cluster
    assert main(args[:-1] + [str(tmp_path / "pl2"), *tiny]) == 2
    assert "too few utterances per cluster" in capsys.readouterr().err


def test_the_confidence_rule_and_purity():
    labels = np.array([0, 0, 0, 1, 1, 2])
    margin = np.array([0.9, 0.8, 0.1, 0.7, 0.6, 0.5])
    # The lowest 1/6 by margin go (the third of cluster 0), then clusters left below 2: cluster 2.
    assert keep_confident(labels, margin, 1 / 6, 2).tolist() == [True, True, False, True, True, False]
    assert purity(np.array([0, 0, 0, 1]), np.array([5, 5, 6, 6])) == 0.75


def test_embeddings_missing_an_utterance_is_one_line(tmp_path, capsys):
    data = corpus(tmp_path)
    with open(data / "wav.scp", "a") as f:
        f.write("zz-0 /audio/zz-0.wav\n")
    args = ["--embeddings", str(tmp_path / "emb.npz"), "--data", str(data), "--out", str(tmp_path / "pl")]
    assert main(args + ["--clusters", "8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no embedding for 'zz-0'" in err
    assert not (tmp_path / "pl").exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--clusters", "0"], "--clusters must be 2 or more, got 0"),  # 0 once meant "estimate" without a word
        (["--estimate", "--threshold", "-1"], "--threshold must be a cosine distance in (0, 2), got -1.0"),
        (["--estimate", "--estimate-sample", "1"], "--estimate-sample must be 2 or more, got 1"),
        (["--clusters", "8", "--sample", "0"], "--sample must be 1 or more, got 0"),
        (["--clusters", "8", "--min-size", "0"], "--min-size must be 1 or more, got 0"),
        # A rule that keeps no two clusters would write a data dir that training then refuses
        (["--clusters", "8", "--min-size", "50"], "8 clusters of 84 utterances leave 0 cluster(s) of --min-size 50"),
        # A cut above every distance: one cluster, once reported as "give --clusters between 2 and 84"
        (["--estimate", "--threshold", "1.99"], "error: --estimate: AHC at --threshold 1.99 made 1 cluster of 84"),
        # The whole set clustered into nearly as many clusters as utterances: no count, nothing to train on
        (
            ["--estimate", "--threshold", "0.001"],
            "too few utterances per cluster to estimate the count: raise --threshold or",
        ),
    ],
)
def test_settings_that_cannot_give_pseudo_labels_are_one_line_and_write_nothing(tmp_path, capsys, extra, message):
    data = corpus(tmp_path)
    args = ["--embeddings", str(tmp_path / "emb.npz"), "--data", str(data), "--out", str(tmp_path / "pl")]
    try:
        code = main(args + extra)
    except SystemExit as e:  # the argument checks: argparse's usage line, then the error
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err and err.count("error:") == 1, err
    assert "AHC found" not in err  # no count printed before an error about it
    assert not (tmp_path / "pl").exists()


def test_k_means_seeds_come_from_part_of_a_large_sample():
    """Past SEED_ROWS sampled rows, the k-means++ seeds are drawn from the first max(SEED_ROWS, 3 k) of them (their
    cost grows with rows x k; bench/pseudo_label_scale.py): 12,000 utterances of 40 speakers, three draws, each
    clustered with at most a few speakers merged or split (one k-means run, as seeds from every row give: 0.95-1.0
    here; the bound leaves room for another local optimum on another CPU's BLAS)."""
    from speakerlab.train.pseudo_label import SEED_ROWS, assign, kmeans_centroids, unit

    for seed in range(3):
        g = np.random.default_rng(seed)
        who = g.integers(40, size=12_000)
        x = unit(g.standard_normal((40, 32))[who] + 0.3 * g.standard_normal((12_000, 32)))
        assert len(x) > SEED_ROWS
        labels = assign(x, kmeans_centroids(x, 40, 200_000, 0))[0]
        assert purity(labels, who) >= 0.925 and purity(who, labels) >= 0.925


@pytest.mark.parametrize("truth", ["lacking", "missing", "bad line"])
def test_true_labels_that_cannot_be_measured_write_nothing(tmp_path, capsys, truth):
    """--true-labels is read before the data dir is written: a file lacking an utterance, missing or with a bad line
    is one error line naming it, and an earlier round's labels in --out stay as they were."""
    data = corpus(tmp_path)
    out = tmp_path / "pl"
    args = ["--embeddings", str(tmp_path / "emb.npz"), "--data", str(data), "--out", str(out), "--clusters", "8"]
    assert main(args + ["--drop", "0"]) == 0
    before = {p.name: p.read_text() for p in out.iterdir() if p.is_file()}
    capsys.readouterr()
    u2s = tmp_path / "utt2spk"
    if truth == "lacking":
        u2s.write_text("".join(u2s.read_text().splitlines(keepends=True)[1:]))
    elif truth == "missing":
        u2s.unlink()
    else:
        u2s.write_text("s0-0\n")
    assert main(args + ["--clusters", "4", "--true-labels", str(u2s)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {u2s}"), err
    assert {p.name: p.read_text() for p in out.iterdir() if p.is_file()} == before


def test_out_that_is_the_data_dir_is_refused(tmp_path, capsys):
    """--out naming the --data dir would replace its wav.scp by the kept utterances (those dropped lost)."""
    data = corpus(tmp_path)
    wav = (data / "wav.scp").read_text()
    args = ["--embeddings", str(tmp_path / "emb.npz"), "--data", str(data), "--out", str(data / "."), "--clusters", "8"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is the --data dir" in err, err
    assert (data / "wav.scp").read_text() == wav and not (data / "utt2spk").exists()
