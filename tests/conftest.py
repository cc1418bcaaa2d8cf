"""What many test files read, built once per session. Nothing here may be changed by a test: a test that
modifies one of these (an exp dir it resumes, a corpus it rewrites) copies it into its own tmp_path first."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

from tests.fake_corpora import make_synth_corpus
from tests.helpers import ROOT, TINY_CAMPPLUS, tiny_config


class TinyRun(NamedTuple):
    """A training run of tests/helpers.tiny_config (no validation dir): its config, training data dir, exp dir."""

    config: Path
    train: Path
    exp: Path


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory):
    """(config, train dir) of the tiny training run, shared by the trained fixtures below."""
    return tiny_config(tmp_path_factory.mktemp("tiny"), val=False)


def _train(tiny_corpus, exp: Path, *overrides: str) -> TinyRun:
    from speakerlab.train.loop import main as train_main

    config, train = tiny_corpus
    assert train_main(["--config", str(config), "--exp-dir", str(exp), *overrides]) == 0
    return TinyRun(config, train, exp)


@pytest.fixture(scope="session")
def tiny_model(tiny_corpus, tmp_path_factory):
    """The tiny CAM++ trained one epoch (2 steps, `train.epochs=1` in its config): checkpoints/epoch_001.pt is
    the last, and the model that the init, bad-input, extraction and checkpoint tests start from or read."""
    return _train(tiny_corpus, tmp_path_factory.mktemp("tiny_model") / "exp", "train.epochs=1")


@pytest.fixture(scope="session")
def tiny_run(tiny_corpus, tmp_path_factory):
    """The tiny config's whole run, uninterrupted: 2 epochs of 2 steps, both epoch checkpoints kept. The
    reference of the resume tests and the run that the averaging test averages (in a copy)."""
    return _train(tiny_corpus, tmp_path_factory.mktemp("tiny_run") / "exp")


@pytest.fixture(scope="session")
def ckpt(tmp_path_factory):
    """A randomly initialised 16-D tiny CAM++ (seed 0) with the default Kaldi fbank, as a checkpoint file: the
    model of the embedding, extraction and verification tests (what they compare is path against path)."""
    from speakerlab.checkpoint import Checkpoint, save_checkpoint
    from speakerlab.features.fbank import FbankConfig
    from speakerlab.features.spec import FeatureSpec
    from speakerlab.models import build_model

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("ckpt") / "c.pt"
    model = build_model("campplus", **TINY_CAMPPLUS).state_dict()
    save_checkpoint(
        path,
        Checkpoint(model_name="campplus", model_args=TINY_CAMPPLUS, model=model, features=FeatureSpec(FbankConfig())),
    )
    return path


@pytest.fixture(scope="session")
def synth_corpus(tmp_path_factory):
    """The synthetic voices of `python -m speakerlab.synth` for the corpus tests: 10 training speakers x 5
    utterances, 4 val and 4 test speakers x 4 utterances, all 1-1.4 s, with the generator's MUSAN- and
    RIRS_NOISES-shaped trees. The recipe tests re-pack it into each corpus's release layout."""
    return make_synth_corpus(
        tmp_path_factory.mktemp("synth"), train_speakers=10, utts=5, eval_speakers=4, eval_utts=4, dur=(1.0, 1.4)
    )


# egs/mini's corpus for the recipe's end-to-end runs (tests/test_mini_recipe.py, tests/test_ssl_train.py): big enough
# for a small CAM++ to learn in 100 steps, small enough for minutes on 2 cores.
MINI_CORPUS = (
    "--num-train-speakers 20 --num-val-speakers 3 --num-test-speakers 8 --utts-per-speaker 8 "
    "--eval-utts-per-speaker 4 --min-dur 1.0 --max-dur 1.5 --eval-min-dur 1.5 --eval-max-dur 2.0"
)


class MiniCorpus(NamedTuple):
    """egs/mini's stage 1 with MINI_CORPUS: its data dir and what the stage printed."""

    data: Path
    log: str


@pytest.fixture(scope="session")
def mini_corpus(tmp_path_factory):
    """`bash egs/mini/run.sh --stage 1 --stop_stage 1` once (the synthetic corpus and its MUSAN/RIR lists). Stage 2
    writes into the data dir (indexes, fbank stores, the noise bank): a test copies it into its tmp_path and runs
    the recipe from stage 2 (the copied lists keep naming the session's audio, which no test changes)."""
    data = tmp_path_factory.mktemp("mini") / "data"
    r = subprocess.run(
        ["bash", str(ROOT / "egs" / "mini" / "run.sh"), "--data", str(data), "--exp", str(data.parent / "exp")]
        + ["--stage", "1", "--stop_stage", "1", "--corpus_opts", MINI_CORPUS],
        env={**os.environ, "OMP_NUM_THREADS": "2"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return MiniCorpus(data, r.stdout + r.stderr)
