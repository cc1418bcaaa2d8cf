import numpy as np
import pytest
import torch

from speakerlab.checkpoint import Checkpoint, save_checkpoint
from speakerlab.features import FbankConfig, FeatureSpec
from speakerlab.infer import main as infer_main
from speakerlab.models import build_model
from tests.helpers import write_wav

TINY = {
    "embedding_size": 16,
    "growth_rate": 8,
    "bn_size": 2,
    "init_channels": 16,
    "m_channels": 8,
    "num_layers": [1, 1, 1],
}


@pytest.fixture
def wavs(tmp_path):
    rng = np.random.default_rng(0)
    return [
        str(write_wav(tmp_path / f"{i}.wav", (0.1 * rng.standard_normal(16000 + 3000 * i)).astype(np.float32)))
        for i in range(2)
    ]


def test_infer_from_our_checkpoint(tmp_path, wavs, capsys):
    model = build_model("campplus", **TINY)
    save_checkpoint(tmp_path / "c.pt", Checkpoint("campplus", TINY, model.state_dict(), FeatureSpec(FbankConfig())))
    assert infer_main(["--checkpoint", str(tmp_path / "c.pt"), *wavs]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [ln.split()[0] for ln in lines] == wavs and all(len(ln.split()) == 17 for ln in lines)
    assert infer_main(["--checkpoint", str(tmp_path / "c.pt"), "--score", wavs[0], wavs[0]]) == 0
    assert float(capsys.readouterr().out) == pytest.approx(1.0, abs=1e-5)


def test_infer_from_3dspeaker_state_dict(tmp_path, wavs, capsys):
    torch.save(build_model("resnet34").state_dict(), tmp_path / "pretrained.bin")
    assert (
        infer_main(
            [
                "--3dspeaker",
                "resnet34",
                "--weights",
                str(tmp_path / "pretrained.bin"),
                "--out",
                str(tmp_path / "e.npz"),
                *wavs,
            ]
        )
        == 0
    )
    with np.load(tmp_path / "e.npz") as z:
        emb = z["embeddings"]
        assert emb.shape == (2, 192) and np.isfinite(emb).all() and list(z["ids"]) == wavs
    assert infer_main(["--3dspeaker", "resnet34", "--weights", str(tmp_path / "pretrained.bin"), "--score", *wavs]) == 0
    cos = emb[0] @ emb[1] / np.linalg.norm(emb[0]) / np.linalg.norm(emb[1])
    assert float(capsys.readouterr().out) == pytest.approx(cos, abs=2e-6)


def test_infer_reads_audio_at_the_checkpoint_rate(tmp_path, capsys):
    """An 8 kHz model: 8 kHz files are embedded; a 16 kHz file is resampled; a missing one is named (exit 2)."""
    model = build_model("campplus", **TINY)
    save_checkpoint(
        tmp_path / "c8.pt", Checkpoint("campplus", TINY, model.state_dict(), FeatureSpec(FbankConfig(sample_rate=8000)))
    )
    wav8 = write_wav(tmp_path / "a8.wav", 0.1 * np.random.default_rng(1).standard_normal(12000), sample_rate=8000)
    assert infer_main(["--checkpoint", str(tmp_path / "c8.pt"), str(wav8)]) == 0
    assert len(capsys.readouterr().out.split()) == 17
    wav16 = write_wav(tmp_path / "a16.wav", 0.1 * np.random.default_rng(2).standard_normal(16000))
    assert infer_main(["--checkpoint", str(tmp_path / "c8.pt"), str(wav16)]) == 0
    assert len(capsys.readouterr().out.split()) == 17
    assert infer_main(["--checkpoint", str(tmp_path / "c8.pt"), str(tmp_path / "none.wav")]) == 2
    assert f"{tmp_path / 'none.wav'}: cannot read audio" in capsys.readouterr().err
