"""egs/mini_ssl end to end at a tiny size: a corpus with its training labels hidden, SimCLR (the recipe's default
config), its test EER and the baseline, then a pseudo-label round (purity printed against the hidden labels) trained
from the self-supervised backbone."""

import os
import subprocess
from collections import Counter

import pytest
import yaml

from tests.helpers import ROOT, threads

RUN = ROOT / "egs" / "mini_ssl" / "run.sh"
CORPUS = (
    "--num-train-speakers 6 --utts-per-speaker 4 --num-val-speakers 3 --num-test-speakers 3 --eval-utts-per-speaker 3"
)
TINY = (
    "model.args.embedding_size=32 model.args.growth_rate=8 model.args.init_channels=16 model.args.num_layers=[1,1,1] "
    "train.epochs=1 train.global_batch_size=8 hardware.num_workers=0"
)


def recipe(tmp_path, *args):
    r = subprocess.run(
        ["bash", str(RUN), "--data", str(tmp_path / "data"), "--exp", str(tmp_path / "exp" / "dino"), *args],
        env={**os.environ, "OMP_NUM_THREADS": threads()},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return r.stdout + r.stderr


@pytest.mark.slow
def test_mini_ssl_recipe_through_a_pseudo_label_round(tmp_path):
    dino = f"{TINY} dino.prototypes=64 dino.hidden_dim=32 dino.bottleneck_dim=16"
    out = recipe(tmp_path, "--corpus_opts", CORPUS, "--train_overrides", dino)
    unlabelled = tmp_path / "data" / "train_unlabelled"
    assert not (unlabelled / "utt2spk").exists() and (tmp_path / "data" / "train" / "utt2spk").exists()
    assert "24 utterances, unlabelled (no utt2spk)" in out
    # every crop augmented from the corpus's noise bank: unaugmented crops share their utterance's session
    assert "augmentation with probability 1, one of: reverb" in out
    assert "27 trials: EER" in out and "mean log-mel baseline, 27 trials: EER" in out
    # --round_epochs (the recipe's 20) sets the round's length: TINY's train.epochs=1 is left out of the overrides
    round_tiny = TINY.replace("train.epochs=1 ", "")
    assert round_tiny != TINY
    stage10 = "--stage 10 --stop_stage 10 --clusters 6 --round_epochs 1".split()
    out = recipe(tmp_path, *stage10, "--round_overrides", round_tiny)
    # the recipe's own rule (--drop 0): no utterance dropped for its margin, only those of clusters of one
    assert "pseudo-label: all: 24 utterances, 6 true speakers in 6 clusters: purity" in out
    labelled = (unlabelled.parent / "train_unlabelled_dino_pl1" / "utt2spk").read_text().splitlines()
    sizes = Counter(line.split()[1] for line in labelled)  # cluster -> utterances
    assert f"pseudo-label: {len(labelled)} of 24 utterances kept in {len(sizes)} clusters" in out
    # each utterance gone took a cluster with it (a cluster of one); every cluster kept holds two or more
    assert 24 - len(labelled) <= 6 - len(sizes) and min(sizes.values()) >= 2 and all(c.startswith("pl") for c in sizes)
    log = (tmp_path / "exp" / "dino_pl1" / "train.log").read_text()
    assert f"initialised from {tmp_path / 'exp' / 'dino'}" in log and "training done: 1 epochs" in log
    assert "augmentation with probability 0.6, one of: reverb" in log and "a random equaliser" in log
    # the round's AAM margin is the recipe's 0.5, not the supervised config's 0.2
    config = yaml.safe_load((tmp_path / "exp" / "dino_pl1" / "config.yaml").read_text())
    assert config["loss"]["margin"] == 0.5
    # a round from another start (here the round's model) clusters into labels of its own: those the first round's
    # model was trained on stay as they were (a resume of it trains on them)
    first = (unlabelled.parent / "train_unlabelled_dino_pl1" / "utt2spk").read_text()
    recipe(tmp_path, *stage10, "--exp", str(tmp_path / "exp" / "dino_pl1"), "--round_overrides", round_tiny)
    assert (unlabelled.parent / "train_unlabelled_dino_pl1" / "utt2spk").read_text() == first
    assert (unlabelled.parent / "train_unlabelled_dino_pl1_pl1" / "utt2spk").exists()
    log = (tmp_path / "exp" / "dino_pl1_pl1" / "train.log").read_text()
    assert f"initialised from {tmp_path / 'exp' / 'dino_pl1'}" in log and "training done: 1 epochs" in log
