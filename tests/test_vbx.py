"""VBx clustering on a PLDA (speakerlab.diarization.clustering.plda, .vbx, cluster(method="vbx")): the PLDA finds the
speaker subspace of embeddings whose within-speaker noise is strongest elsewhere, the HMM's forward-backward
equals brute-force enumeration, VBx finds the speakers of simulated conversations at least as well as AHC,
and the counts asked for (exact, min, max, one speaker) are honoured."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from speakerlab.diarization.clustering.cluster import (
    SpeakerCount,
    assign_nearest,
    cluster,
    group_neighbours,
    normalize,
    unit_means,
)
from speakerlab.diarization.clustering.plda import PLDAError, fit_plda, load_plda
from speakerlab.diarization.clustering.vbx import VBxParams, constrained_assignment, forward_backward
from tests.test_diarization_scale import agreement

DIM = 32
WORLD_VBX = VBxParams(init_threshold=0.4)
SPEAKER_DIMS = 12  # the speakers differ in these directions of a random rotation; the noise is strongest elsewhere


class World:
    """Embeddings of a made-up embedder: a speaker is a point drawn from an across-speaker Gaussian living
    mostly in `SPEAKER_DIMS` directions; each sub-segment adds within-speaker noise that is four times
    stronger in four other directions (channel, words) than the speaker spread: cosine distances see mostly
    the noise there, a PLDA learns to ignore it."""

    def __init__(self, seed: int = 0):
        g = np.random.default_rng(seed)
        self.rotation, _ = np.linalg.qr(g.standard_normal((DIM, DIM)))
        self.between = np.r_[np.full(SPEAKER_DIMS, 1.0), np.full(DIM - SPEAKER_DIMS, 0.02)]
        self.within = np.r_[np.full(SPEAKER_DIMS, 0.15), np.full(4, 2.0), np.full(DIM - SPEAKER_DIMS - 4, 0.5)]
        self.offset = 0.5 * g.standard_normal(DIM)

    def speakers(self, g, n: int) -> np.ndarray:
        return (g.standard_normal((n, DIM)) * np.sqrt(self.between)) @ self.rotation.T + self.offset

    def emit(self, g, centres: np.ndarray, labels: np.ndarray) -> np.ndarray:
        noise = (g.standard_normal((len(labels), DIM)) * np.sqrt(self.within)) @ self.rotation.T
        return (centres[labels] + noise).astype(np.float32)

    def training(self, seed: int, speakers: int = 200, each: int = 20):
        """`(speakers x each, DIM)` embeddings and their speaker labels."""
        g = np.random.default_rng(seed)
        labels = np.repeat(np.arange(speakers), each)
        return self.emit(g, self.speakers(g, speakers), labels), labels

    def conversation(self, seed: int, speakers: int, n: int = 200):
        """`(n, DIM)` sub-segment embeddings of turns of 3-14 sub-segments, and the true labels."""
        g = np.random.default_rng(seed)
        labels, who = [], 0
        while len(labels) < n:
            who = (who + 1 + g.integers(max(speakers - 1, 1))) % speakers
            labels += [who] * int(g.integers(3, 15))
        labels = np.array(labels[:n])
        return self.emit(g, self.speakers(g, speakers), labels), labels


@pytest.fixture(scope="module")
def world():
    return World(0)


@pytest.fixture(scope="module")
def plda(world):
    return fit_plda(*world.training(1), dim=128)


def test_the_plda_finds_the_speaker_subspace(world, plda):
    """The training speakers (200) could fill 32 directions; the PLDA keeps them ordered by phi, and only
    the 12 the speakers use carry across-speaker variance well above the within-speaker one."""
    assert plda.dim == DIM and np.all(np.diff(plda.phi) <= 0)
    assert plda.phi[SPEAKER_DIMS - 1] > 1.0 and plda.phi[SPEAKER_DIMS] < 0.3
    # Held-out speakers: in the projected space the within-speaker covariance is about the identity.
    x, labels = world.training(7, speakers=50, each=40)
    z = plda.project(x)
    resid = z - np.stack([z[labels == s].mean(axis=0) for s in range(50)])[labels]
    assert np.allclose(np.var(resid, axis=0)[:SPEAKER_DIMS], 1.0, atol=0.25)


def test_the_plda_file_round_trips_and_bad_ones_are_named(tmp_path, plda, world):
    plda.save(tmp_path / "plda.npz")
    again = load_plda(tmp_path / "plda.npz")
    x, _ = world.conversation(3, 3, 20)
    assert np.array_equal(again.project(x), plda.project(x))
    (tmp_path / "other.npz").write_bytes(b"not a numpy file")
    with pytest.raises(PLDAError, match="other.npz"):
        load_plda(tmp_path / "other.npz")
    with pytest.raises(PLDAError, match="no such file"):
        load_plda(tmp_path / "missing.npz")
    with pytest.raises(PLDAError, match="these have 16"):
        plda.project(np.zeros((3, 16)))
    with pytest.raises(PLDAError, match=">= 2 speakers"):
        fit_plda(np.ones((100, 4)), np.zeros(100))


def test_forward_backward_equals_enumerating_every_path():
    g = np.random.default_rng(0)
    t_len, s, loop_p = 5, 3, 0.6
    loglik = 3 * g.standard_normal((t_len, s))
    pi = np.array([0.5, 0.3, 0.2])
    trans = loop_p * np.eye(s) + (1 - loop_p) * pi[None, :]
    total, post, jumps = 0.0, np.zeros((t_len, s)), np.zeros(s)
    for path in itertools.product(range(s), repeat=t_len):
        p = pi[path[0]] * np.exp(loglik[0, path[0]])
        for t in range(1, t_len):
            p *= trans[path[t - 1], path[t]] * np.exp(loglik[t, path[t]])
        total += p
        post[np.arange(t_len), path] += p
        jumps[path[0]] += p  # the first frame is entered by a jump; later ones by the (1 - loop_p) pi part
        for t in range(1, t_len):
            jumps[path[t]] += p * (1 - loop_p) * pi[path[t]] / trans[path[t - 1], path[t]]
    gamma, log_px, got_jumps = forward_backward(loglik, loop_p, pi)
    assert np.isclose(log_px, np.log(total))
    assert np.allclose(gamma, post / total) and np.allclose(got_jumps, jumps / total)


def test_vbx_finds_the_speakers_at_least_as_well_as_ahc(world, plda):
    """20 held-out conversations of 2-6 speakers: VBx's labels agree with the truth at least as well as
    AHC's on average and in the worst conversation, and its estimated count is right in >= 18 of 20."""
    scores = {"ahc": [], "vbx": []}
    right = 0
    for s in range(20):
        k = 2 + s % 5
        x, truth = world.conversation(100 + s, k)
        for method in scores:
            # The made-up embedder's cosine distances are not the mini model's (whose measurements set the
            # default start threshold, 0.6): its own, 0.4.
            labels = cluster(x, SpeakerCount(1, 10), method, plda=plda, vbx_params=WORLD_VBX)
            scores[method].append(agreement(labels, truth))
            right += method == "vbx" and len(np.unique(labels)) == k
    assert np.mean(scores["vbx"]) >= np.mean(scores["ahc"]) and min(scores["vbx"]) >= min(scores["ahc"])
    assert np.mean(scores["vbx"]) >= 0.95 and right >= 18


def test_capped_vbx_ends_on_every_sub_segment(world, plda):
    """Long conversations (1,200 sub-segments of 5 speakers) capped into units of 2: VBx on the units alone keeps
    spurious speakers (units that straddle a change); the VBx pass on every sub-segment started from them
    (cluster.resegment) finds the 5 and agrees with the truth as clustering every sub-segment does."""
    count = SpeakerCount(1, 10)
    for seed in (201, 202, 203):
        x, truth = world.conversation(seed, 5, 1200)
        capped = cluster(x, count, "vbx", plda=plda, max_units=600, vbx_params=WORLD_VBX)
        full = cluster(x, count, "vbx", plda=plda, max_units=0, vbx_params=WORLD_VBX)
        unit_of = group_neighbours(x, 600)
        units = cluster(unit_means(normalize(x), unit_of), count, "vbx", plda=plda, max_units=0, vbx_params=WORLD_VBX)
        before = assign_nearest(normalize(x), unit_of, units)
        assert len(np.unique(before)) > 5 and agreement(before, truth) < 0.95
        assert len(np.unique(capped)) == 5 and agreement(capped, truth) >= 0.99 and agreement(full, truth) >= 0.99


@pytest.mark.parametrize(
    "count", [SpeakerCount.exactly(2), SpeakerCount.exactly(7), SpeakerCount(5, 8), SpeakerCount(1, 3)]
)
def test_vbx_honours_the_count(world, plda, count):
    """A four-speaker conversation: exact counts below and above four, a minimum above, a maximum below."""
    x, _ = world.conversation(5, 4, 150)
    labels = cluster(x, count, "vbx", plda=plda)
    assert count.min <= len(np.unique(labels)) <= count.max
    assert np.array_equal(np.unique(labels), np.arange(labels.max() + 1))


def test_vbx_finds_one_speaker_alone(world, plda):
    x, _ = world.conversation(9, 1, 120)
    assert np.all(cluster(x, SpeakerCount(1, 10), "vbx", plda=plda) == 0)


def test_constrained_assignment_gives_every_speaker_a_segment():
    score = np.log(np.array([[0.9, 0.05, 0.05], [0.8, 0.1, 0.1], [0.6, 0.2, 0.2], [0.2, 0.7, 0.1]]))
    assert constrained_assignment(score[:, :2]).tolist() == [0, 0, 0, 1]  # every column used: argmax
    labels = constrained_assignment(score)  # column 2 is nobody's best: its likeliest row goes to it
    assert sorted(set(labels.tolist())) == [0, 1, 2] and labels.tolist() == [0, 0, 2, 1]


def test_vbx_without_a_plda_says_where_to_get_one():
    with pytest.raises(ValueError, match="speakerlab-plda"):
        cluster(np.ones((4, DIM)), SpeakerCount(), "vbx")
    with pytest.raises(ValueError, match="loop_p"):
        VBxParams(loop_p=1.0)


@pytest.fixture(scope="module")
def train_dir(tmp_path_factory):
    """A data dir of 8 synthetic speakers (other voices than the test conversations'), 4 utterances of 2 s."""
    from speakerlab.synth.spectra import SR
    from speakerlab.synth.voice import draw_session, draw_speaker, synth_utterance
    from tests.helpers import write_wav

    root = tmp_path_factory.mktemp("plda_train")
    scp, u2s = [], []
    for s in range(8):
        voice = draw_speaker(np.random.default_rng([77, s]))
        for u in range(4):
            g = np.random.default_rng([77, s, u])
            wave = synth_utterance(voice, 2 * SR, g, draw_session(g, snr_range=(20, 30)))
            utt = f"s{s}-u{u}"
            scp.append(f"{utt} {write_wav(root / f'{utt}.wav', wave)}\n")
            u2s.append(f"{utt} s{s}\n")
    (root / "wav.scp").write_text("".join(scp))
    (root / "utt2spk").write_text("".join(u2s))
    return root


def test_speakerlab_plda_fits_a_plda_that_speakerlab_diarize_uses(capsys, tmp_path, train_dir, ckpt):
    """speakerlab-plda on a training set -> a PLDA of the model's digest; speakerlab-diarize --clustering vbx
    with it honours an exact count, says "no speech" for silence, and refuses a PLDA of another model."""
    from speakerlab.diarization.clustering.plda_fit import run as plda_run
    from speakerlab.sources import read_source
    from tests.helpers import write_wav
    from tests.test_diarization import THREE, diarize, talk

    out = tmp_path / "plda.npz"
    assert plda_run(["--data", str(train_dir), "--checkpoint", str(ckpt), "--out", str(out)]) == 0
    assert "96 windows of 1.5 s from 32 utterances of 8 speakers" in capsys.readouterr().err
    plda = load_plda(out)
    assert plda.model_id == read_source(ckpt).digest and plda.dim == 7  # 8 speakers: 7 directions at most
    wave, _ = talk(*THREE)
    wav = write_wav(tmp_path / "three.wav", wave)
    vbx = ["--checkpoint", ckpt, "--vad", "energy", "--clustering", "vbx", "--plda", out]
    code, _, _ = diarize(capsys, wav, *vbx, "--num-speakers", 3, "--rttm", tmp_path / "h.rttm")
    assert code == 0 and len({line.split()[7] for line in (tmp_path / "h.rttm").read_text().splitlines()}) == 3
    silence = write_wav(tmp_path / "quiet.wav", np.zeros(16000 * 3, np.float32))
    code, out_text, err = diarize(capsys, silence, *vbx)
    assert code == 0 and out_text == "" and "no speech" in err
    other = tmp_path / "other.npz"
    replace(plda, model_id="0" * 12).save(other)
    code, _, err = diarize(capsys, wav, *vbx[:-1], other)
    assert code == 2 and err.startswith(f"error: {other}: the PLDA was fitted to the embeddings of model 000000000000")


def test_a_plda_of_other_dimensions_is_one_line_naming_its_file(capsys, tmp_path, plda, ckpt):
    """The message once named no file: 'the PLDA is for 32-dimensional embeddings, these have 16'."""
    from tests.helpers import write_wav
    from tests.test_diarization import THREE, diarize, talk

    plda.save(tmp_path / "plda.npz")
    wav = write_wav(tmp_path / "three.wav", talk(*THREE)[0])
    args = [wav, "--checkpoint", ckpt, "--vad", "energy", "--clustering", "vbx", "--plda", tmp_path / "plda.npz"]
    code, out, err = diarize(capsys, *args)
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert err.startswith(
        f"error: {tmp_path / 'plda.npz'}: the PLDA is for {DIM}-dimensional embeddings, these have 16"
    )


def test_speakerlab_plda_names_what_cannot_fit_before_embedding(capsys, tmp_path, train_dir, ckpt):
    """One speaker is said before any window is embedded, naming the utt2spk; a set too small for the model's
    dimension names the data dir and what to add; an option out of range names the option."""
    from speakerlab.diarization.clustering.plda_fit import run as plda_run

    one = tmp_path / "one"
    one.mkdir()
    for name in ("wav.scp", "utt2spk"):
        (one / name).write_text("".join(line for line in (train_dir / name).open() if line.startswith("s0-")))
    args = ["--checkpoint", str(ckpt), "--out", str(tmp_path / "p.npz")]
    assert plda_run(["--data", str(one), *args]) == 2
    assert capsys.readouterr().err == f"error: {one / 'utt2spk'}: 1 speaker: a PLDA needs utterances of 2 or more\n"
    two = tmp_path / "two"
    two.mkdir()
    for name in ("wav.scp", "utt2spk"):
        (two / name).write_text(
            "".join(line for line in (train_dir / name).open() if line.startswith(("s0-u0", "s1-u0")))
        )
    assert plda_run(["--data", str(two), *args, "--per-utterance", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {two}: a PLDA of ") and "got 2 (more utterances, or more --per-utterance" in err
    with pytest.raises(SystemExit) as stop:
        plda_run(["--data", str(train_dir), *args, "--batch-size", "0"])
    assert stop.value.code == 2 and "--batch-size must be 1 or more, got 0" in capsys.readouterr().err
