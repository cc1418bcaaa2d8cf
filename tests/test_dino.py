"""DINO (loss.name dino) end to end on a tiny model and an unlabelled corpus: exact resume mid-epoch (teacher,
centre and schedules in the checkpoint), 2 processes equal to 1 with accumulation, collapse said at the end,
an unlabelled data dir from preparation to embeddings, a run with an augmentation per crop. The tiny run weights
KoLeo, RDINO's regularisers and the contrastive term (C3-DINO), so resume and the 2-process equality cover them;
SimCLR alone (no teacher) resumes exactly too, and its InfoNCE is checked against a cross-entropy written apart."""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from speakerlab.checkpoint import load_checkpoint
from speakerlab.dataio.loaders.shards import write_shards
from speakerlab.dataio.tables.embeddings import read_embeddings
from speakerlab.dataio.tables.prepare import prepare
from speakerlab.inference.extract import main as extract_main
from speakerlab.objectives import DinoSettings
from speakerlab.train.loop import main as train_main
from speakerlab.train.losses.dino import DinoHead, info_nce, nearest_is_own
from speakerlab.train.pseudo_label import main as pseudo_label_main
from tests.helpers import ROOT, free_port, losses, tiny_config, write_wav
from tests.test_augment import write_lists

DINO = """dino: {prototypes: 64, hidden_dim: 32, bottleneck_dim: 16, global_seconds: 0.4, local_seconds: 0.2,
       local_crops: 2, teacher_temp_warmup_epochs: 1, koleo_weight: 0.1, diversity_weight: 2.0, redundancy_weight: 0.2,
       contrastive_weight: 0.5, contrastive_temp: 0.1}
features: {dither: 0.0}
"""


def dino_config(tmp_path, extra=""):
    """tests.helpers.tiny_config with loss.name dino, its train dir without utt2spk (prepared)."""
    cfg, train = tiny_config(tmp_path, val=False, extra=DINO + extra)
    (train / "utt2spk").unlink()
    prepare(train, jobs=1)
    text = cfg.read_text().replace("loss: {margin: 0.2, margin_start_epoch: 0, margin_warmup_epochs: 1}", "")
    cfg.write_text(text + "loss: {name: dino}\n")
    return cfg, train


def teacher(path):
    """The teacher's weights and the centre of a checkpoint (BatchNorm's statistics left out: each rank's teacher
    counts its own batches)."""
    state = load_checkpoint(path).classifier
    stats = ("running_", "num_batches_tracked")
    return {
        k: v for k, v in state.items() if k == "center" or (k.startswith("teacher.") and not any(s in k for s in stats))
    }


def assert_same(a, b, **tol):
    assert sorted(a) == sorted(b)
    for k in a:
        torch.testing.assert_close(a[k].float(), b[k].float(), msg=k, **tol)


@pytest.fixture(scope="module")
def dino_run(tmp_path_factory):
    """(config, unlabelled train dir, exp) of the tiny DINO run, uninterrupted: 2 epochs of 2 steps."""
    tmp = tmp_path_factory.mktemp("dino")
    cfg, train = dino_config(tmp)
    assert train_main(["--config", str(cfg), "--exp-dir", str(tmp / "ref")]) == 0
    return cfg, train, tmp / "ref"


def test_resume_mid_epoch_equals_uninterrupted(dino_run, tmp_path):
    cfg, _, ref = dino_run
    cut = tmp_path / "cut"
    log = (ref / "train.log").read_text()
    assert "unlabelled" in log and "teacher_entropy" in log and "embedding_spread" in log
    for steps in ("1", "2"):  # mid-epoch 1, then mid-epoch 2
        assert train_main(["--config", str(cfg), "--exp-dir", str(cut), "--max-steps", steps]) == 0
    assert train_main(["--config", str(cfg), "--exp-dir", str(cut)]) == 0
    a, b = losses(ref), losses(cut)
    assert sorted(a) == sorted(b) == [1, 2, 3, 4]
    for step in a:
        assert b[step] == pytest.approx(a[step], rel=1e-6, abs=1e-7), step
    last_a, last_b = ref / "checkpoints" / "epoch_002.pt", cut / "checkpoints" / "epoch_002.pt"
    assert_same(teacher(last_a), teacher(last_b), rtol=1e-5, atol=1e-6)
    assert_same(load_checkpoint(last_a).model, load_checkpoint(last_b).model, rtol=1e-5, atol=1e-6)
    # The centre moved and the teacher was started from the student
    state = load_checkpoint(last_a).classifier
    assert state["center"].abs().sum() > 0 and state["started"] == 1


@pytest.mark.slow  # three short training runs: ~10 s
def test_dino_streams_tar_shards_of_the_unlabelled_dir_and_resumes_exactly(tmp_path):
    """The multi-crop views come from the tar-shard stream as from the file loader (each crop its own draws): a
    run on shards written from the unlabelled dir, cut mid-epoch twice, ends as the uninterrupted one."""
    cfg, train = dino_config(tmp_path)
    write_shards(train, tmp_path / "shards", per_shard=3, log=lambda m: None)
    run = ["--config", str(cfg), f"data.shards={tmp_path / 'shards'}"]
    ref, cut = tmp_path / "ref", tmp_path / "cut"
    assert train_main([*run, "--exp-dir", str(ref)]) == 0
    assert "utterances, unlabelled in shards" in (ref / "train.log").read_text()
    for steps in ("1", "3"):
        assert train_main([*run, "--exp-dir", str(cut), "--max-steps", steps]) == 0
    assert train_main([*run, "--exp-dir", str(cut)]) == 0
    a, b = losses(ref), losses(cut)
    assert sorted(a) == sorted(b) == [1, 2, 3, 4] and all(np.isfinite(v) for v in a.values())
    for step in a:
        assert b[step] == pytest.approx(a[step], rel=1e-6, abs=1e-7), step
    last = Path("checkpoints") / "epoch_002.pt"
    assert_same(teacher(ref / last), teacher(cut / last), rtol=1e-5, atol=1e-6)


def test_matching_speakers_of_a_self_supervised_init_is_one_error(dino_run, tmp_path, capsys):
    """A DINO checkpoint has a head but no speaker rows: train.init_match_speakers named, nothing written (it
    ended in a KeyError from inside the classifier's start)."""
    cfg, _ = tiny_config(tmp_path, val=False)
    exp = tmp_path / "exp"
    args = ["--config", str(cfg), "--exp-dir", str(exp), f"train.init={dino_run[2]}", "train.init_match_speakers=true"]
    assert train_main(args) == 2
    assert "config key 'train.init_match_speakers'" in capsys.readouterr().err
    assert train_main([*args, "--check"]) == 2
    assert "was trained without speaker labels (loss.name dino)" in capsys.readouterr().err and not exp.exists()


@pytest.mark.slow
def test_the_unlabelled_dir_is_embedded_clustered_and_trained_on_from_the_dino_backbone(dino_run, tmp_path):
    cfg, train, ref = dino_run
    out = tmp_path / "emb.npz"
    assert extract_main(["--checkpoint", str(ref), "--data", str(train), "--out", str(out), "--num-workers", "0"]) == 0
    ids, emb = read_embeddings(out)
    assert ids == sorted(f"s{s}-{u}" for s in range(4) for u in range(4)) and np.isfinite(emb).all()
    # A pseudo-label round: the clusters as a labelled dir, the supervised objective from the DINO backbone
    labelled = tmp_path / "pl1"
    args = ["--embeddings", str(out), "--data", str(train), "--out", str(labelled), "--clusters", "4"]
    assert pseudo_label_main([*args, "--drop", "0.25", "--min-size", "1"]) == 0
    prepare(labelled, jobs=1)
    assert len(labelled.joinpath("utt2spk").read_text().splitlines()) == 12
    round1 = tmp_path / "round1"
    supervised = ["loss.name=aam", "train.epochs=1", f"data.train={labelled}", f"train.init={ref}"]
    assert train_main(["--config", str(cfg), "--exp-dir", str(round1), *supervised]) == 0
    log = (round1 / "train.log").read_text()
    assert f"initialised from {ref}" in log and "new classifier for" in log
    start = load_checkpoint(round1 / "pretrained.pt").model
    assert_same(start, load_checkpoint(ref / "checkpoints" / "epoch_002.pt").model)  # the student as it ended


def test_silent_audio_collapses_and_the_run_says_so(tmp_path, capsys):
    cfg, train = dino_config(tmp_path)
    cfg.write_text(
        re.sub(
            "^train: .*$", "train: {epochs: 1, global_batch_size: 8, log_every_steps: 1}", cfg.read_text(), flags=re.M
        )
    )
    for wav in (train / "wav").glob("*.wav"):  # every crop the same: every embedding the same
        write_wav(wav, np.zeros(int(0.6 * 16000)))
    (train / "utt2num_samples").unlink()
    exp = tmp_path / "exp"
    assert train_main(["--config", str(cfg), "--exp-dir", str(exp)]) == 3
    log = (exp / "train.log").read_text()
    assert "error: the embeddings collapsed: their spread is" in log, log[-2000:]
    assert "training done: 1 epochs" in log  # the checkpoints are written, the message comes after


@pytest.mark.slow
def test_two_processes_equal_one_with_accumulation(tmp_path):
    cfg, _ = dino_config(tmp_path)
    one = tmp_path / "one"
    assert train_main(["--config", str(cfg), "--exp-dir", str(one)]) == 0
    assert "global 8 = 1 device(s) x 4 x accum 2" in (one / "train.log").read_text()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    two = tmp_path / "two"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}"]
    cmd += ["-m", "speakerlab.train", "--config", str(cfg), "--exp-dir", str(two)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "global 8 = 2 device(s) x 4 x accum 1" in (two / "train.log").read_text()
    a, b = losses(one), losses(two)
    assert sorted(a) == sorted(b) == [1, 2, 3, 4]
    for step in a:
        assert b[step] == pytest.approx(a[step], rel=1e-5, abs=1e-6), step
    ck = "checkpoints/epoch_002.pt"
    assert_same(teacher(one / ck), teacher(two / ck), rtol=1e-4, atol=1e-5)


@pytest.mark.slow  # a training run: ~20 s
def test_dino_trains_with_an_augmentation_per_crop(tmp_path, capsys):
    rng = np.random.default_rng(0)
    lists = write_lists(tmp_path / "musan", {"noise.scp": [0.2 * rng.standard_normal(16000)]})
    cfg, _ = dino_config(tmp_path, f"augment: {{lists: {lists}, prob: 1.0, kinds: [noise]}}\n")
    assert train_main(["--config", str(cfg), "--exp-dir", str(tmp_path / "exp")]) == 0
    assert "augmentation with probability 1" in capsys.readouterr().err
    steps = losses(tmp_path / "exp")
    assert len(steps) == 4 and all(np.isfinite(v) for v in steps.values())


def test_info_nce_is_simclr_nt_xent_for_two_crops_and_rewards_crops_that_find_each_other():
    torch.manual_seed(0)
    a, b = torch.nn.functional.normalize(torch.randn(2, 6, 8), dim=-1)
    # NT-Xent as SimCLR writes it: row i of [a; b] has its positive at i + 6 (mod 12) among the 11 others
    logits = torch.cat([a, b]) @ torch.cat([a, b]).T / 0.1
    logits.fill_diagonal_(float("-inf"))
    target = torch.cat([torch.arange(6, 12), torch.arange(6)])
    expected = torch.nn.functional.cross_entropy(logits, target)
    torch.testing.assert_close(info_nce(torch.stack([a, b]), 0.1), expected)
    near = torch.nn.functional.normalize(a + 0.05 * torch.randn(6, 8), dim=-1)
    assert info_nce(torch.stack([a, near]), 0.1) < 0.2 * expected  # each crop's twin is its nearest
    assert nearest_is_own(torch.stack([a, near])).all()
    assert nearest_is_own(torch.stack([a, near[torch.tensor([1, 0, 2, 3, 4, 5])]])).tolist() == [0, 0, 1, 1, 1, 1]
    three = torch.stack([a, near, torch.nn.functional.normalize(a + 0.05 * torch.randn(6, 8), dim=-1)])
    assert info_nce(three, 0.1) < 0.2 * expected  # V = 3: two positives each
    assert DinoHead(8, DinoSettings(distill_weight=0.0, contrastive_weight=1.0, hidden_dim=4)).prototypes is None


def test_simclr_alone_trains_without_a_teacher_and_resumes_exactly(tmp_path):
    cfg, _ = dino_config(tmp_path)
    simclr = ["dino.distill_weight=0", "dino.contrastive_weight=1", "dino.local_crops=0", "dino.disjoint_globals=true"]
    simclr = ["--config", str(cfg), *simclr, "data.crop_seconds=0.8"]
    ref, cut = tmp_path / "ref", tmp_path / "cut"
    assert train_main([*simclr, "--exp-dir", str(ref)]) == 0
    assert train_main([*simclr, "--exp-dir", str(cut), "--max-steps", "3"]) == 0
    assert train_main([*simclr, "--exp-dir", str(cut)]) == 0
    a, b = losses(ref), losses(cut)
    assert sorted(a) == sorted(b) == [1, 2, 3, 4] and all(b[k] == pytest.approx(a[k], rel=1e-6) for k in a)
    last = load_checkpoint(ref / "checkpoints" / "epoch_002.pt")
    assert not any(k.startswith(("teacher.", "head.prototypes")) for k in last.classifier)
    assert "contrastive_loss" in (ref / "train.log").read_text()
