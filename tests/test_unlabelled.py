"""Unlabelled data dirs (wav.scp, no utt2spk): prepared, read into training's compact lists without speakers,
and the one-line errors of a labelled objective given unlabelled data and of a self-supervised one told to read
labels."""

import numpy as np
import pytest

from speakerlab.config import ConfigError, load_config
from speakerlab.dataio.tables.compact import UNLABELLED, read_compact, without_labels
from speakerlab.dataio.tables.corpora import Corpus, TrainLists
from speakerlab.dataio.tables.lists import ListError
from speakerlab.dataio.tables.prepare import prepare
from speakerlab.train.inputs.loader import load_train_lists
from tests.helpers import make_data_dir


def unlabelled_dir(path, n=5):
    root = make_data_dir(path, {f"u{i}": "x" for i in range(n)}, seconds=0.25)
    (root / "utt2spk").unlink()
    return root


def test_an_unlabelled_dir_is_prepared_and_read_without_speakers(tmp_path):
    root = unlabelled_dir(tmp_path / "d")
    assert prepare(root, jobs=1) == f"{root}: 5 utterances, unlabelled (no utt2spk), 0.00 h"
    assert not (root / "spk2utt").exists()
    for _ in range(2):  # the fast read, then the memory-mapped cache it left
        lists = read_compact(root)
        assert not lists.labelled and len(lists.speakers) == 0
        assert lists.labels.tolist() == [UNLABELLED] * 5
        assert lists.lengths.tolist() == [4000] * 5
        assert [lists.utts()[i] for i in range(5)] == [f"u{i}" for i in range(5)]


def test_a_labelled_dir_without_its_labels_joins_an_unlabelled_one(tmp_path):
    a = read_compact(make_data_dir(tmp_path / "a", {"a-1": "a", "b-1": "b"}, seconds=0.25))
    b = read_compact(unlabelled_dir(tmp_path / "b", 3))
    assert a.labelled and a.labels.tolist() == [0, 1]
    joined = TrainLists([Corpus(name="a", lists=without_labels(a)), Corpus(name="b", lists=b)])
    assert joined.speakers == [] and np.all(joined.labels == UNLABELLED) and len(joined) == 5
    assert "unlabelled" in joined.describe()
    with pytest.raises(ValueError, match="all labelled or all unlabelled"):
        TrainLists([Corpus(name="a", lists=a), Corpus(name="b", lists=b)])


def config(tmp_path, train, *overrides):
    path = tmp_path / "c.yaml"
    path.write_text(f"data: {{train: {train}, crop_seconds: 0.2}}\nmodel: {{name: campplus}}\n")
    return load_config(path, list(overrides))


def test_a_labelled_objective_given_unlabelled_data_names_the_missing_utt2spk(tmp_path):
    root = unlabelled_dir(tmp_path / "d")
    with pytest.raises(ListError) as e:
        load_train_lists(config(tmp_path, root), print)
    message = str(e.value)
    assert "\n" not in message and str(root / "utt2spk") in message
    assert "loss.name aam classifies speakers" in message and "loss.name to dino" in message


DINO = ("loss.name=dino", "dino.global_seconds=0.2", "dino.local_seconds=0.1")


def test_data_labels_against_the_objective(tmp_path):
    root = unlabelled_dir(tmp_path / "d")
    with pytest.raises(ConfigError, match=r"'data.labels' \(true\): loss.name dino learns without speaker labels"):
        config(tmp_path, root, *DINO, "data.labels=true")
    with pytest.raises(ConfigError, match=r"'dino.global_seconds' \(3\) must be <= data.crop_seconds \(0.2\)"):
        config(tmp_path, root, "loss.name=dino")
    with pytest.raises(ConfigError, match=r"'data.feats': loss.name dino cuts its crops from the audio"):
        config(tmp_path, root, *DINO, "data.feats=true")
    assert config(tmp_path, root, *DINO, "data.feats=auto").data.feats is False
    with pytest.raises(ConfigError, match=r"'dino.disjoint_globals': 2 global crops of 0.2 s .* >= 0.4 \(it is 0.2\)"):
        config(tmp_path, root, *DINO, "dino.disjoint_globals=true")
    assert config(tmp_path, root, *DINO, "dino.disjoint_globals=true", "data.crop_seconds=0.4").dino.disjoint_globals
    with pytest.raises(ConfigError, match=r"'dino.head_layers': 0 \(no projection MLP\) is for SimCLR alone"):
        config(tmp_path, root, *DINO, "dino.head_layers=0")
    with pytest.raises(ConfigError, match=r"'dino.local_crops' \(4\): without self-distillation"):
        config(tmp_path, root, *DINO, "dino.distill_weight=0", "dino.contrastive_weight=1")
    with pytest.raises(ConfigError, match=r"'dino.distill_weight': 0 with dino.contrastive_weight 0 leaves nothing"):
        config(tmp_path, root, *DINO, "dino.distill_weight=0", "dino.local_crops=0")
    with pytest.raises(ConfigError, match=r"'data.labels' \(false\): loss.name aam classifies speakers"):
        config(tmp_path, root, "data.labels=false")
    labelled = make_data_dir(tmp_path / "l", {"a-1": "a", "b-1": "b"}, seconds=0.25)
    data = load_train_lists(config(tmp_path, labelled, *DINO), print)  # auto: labels not read
    assert data.speakers == [] and data.labels.tolist() == [UNLABELLED] * 2


def test_local_seconds_bind_the_crop_only_when_there_are_local_crops(tmp_path):
    """SimCLR (no local crops) on crops shorter than the unused dino.local_seconds was refused naming that key."""
    root = unlabelled_dir(tmp_path / "d")
    simclr = ("loss.name=dino", "dino.global_seconds=0.1", "dino.distill_weight=0", "dino.contrastive_weight=1")
    assert config(tmp_path, root, *simclr, "dino.local_crops=0").dino.local_seconds == 2  # its default, unused
    with pytest.raises(ConfigError, match=r"'dino.local_seconds' \(2\) must be <= data.crop_seconds \(0.2\)"):
        config(tmp_path, root, "loss.name=dino", "dino.global_seconds=0.1")  # DINO's 4 local crops of 2 s
