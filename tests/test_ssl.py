"""Self-supervised front-ends (speakerlab.models.ssl, speakerlab.features.w2vbert): tiny random encoders of
each family written by transformers' save_pretrained to temporary directories, loaded as a downloaded
model would be."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from speakerlab.config import ConfigError, OptimSettings, load_config
from speakerlab.features.spec import build_features
from speakerlab.features.w2vbert import W2VBertFbank
from speakerlab.frontends import FeatureSpec, W2VBertFbankConfig, WaveformConfig, feature_spec
from speakerlab.models import build_model, list_models, list_ssl_models
from speakerlab.models.ssl.encoders import require_ssl
from speakerlab.train.optim.groups import check_encoder_settings, parameter_groups
from tests.helpers import TINY_ENCODERS, save_tiny_encoder

ROOT = Path(__file__).resolve().parent.parent
FAMILIES = list(TINY_ENCODERS)
# wav2vec 2.0 and HuBERT share WavLM's convolutional encoder and wav2vec 2.0's attention: the fast lane checks
# WavLM and w2v-BERT, the slow lane all four.
EVERY_FAMILY = [pytest.param(f, marks=pytest.mark.slow) if f in ("wav2vec2", "hubert") else f for f in FAMILIES]
BACKENDS = {
    "ssl_mhfa": {"heads": 4, "compression_dim": 8, "embedding_size": 16},
    "ssl_ecapa_tdnn": {"channels": 16, "embedding_size": 16},
    "ssl_mfa": {"adapter_dim": 8, "embedding_size": 16},
}


@pytest.fixture(scope="module")
def encoder_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("encoders")
    return {family: save_tiny_encoder(root / family, family) for family in FAMILIES}


def model_input(model, batch: int = 2, samples: int = 8000, seed: int = 0) -> torch.Tensor:
    """A random wave through the front-end of the model's encoder family."""
    spec = FeatureSpec(W2VBertFbankConfig() if model.input_kind == "w2vbert_fbank" else WaveformConfig(), True)
    wave = 0.1 * torch.randn(batch, samples, generator=torch.Generator().manual_seed(seed))
    return build_features(spec)(wave)


def speech_like(n: int, seed: int) -> np.ndarray:
    """A loud voiced stretch over noise, a quiet stretch and a run of digital silence: float32 in [-1, 1)."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / 16000
    x = 0.4 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 3 * t)) + 0.02 * rng.standard_normal(n)
    x[n // 3 : n // 2] *= 1e-3
    x[n // 2 : n // 2 + 800] = 0.0
    return x.astype(np.float32)


@pytest.mark.parametrize("samples", [16000, 16160, 24321])
def test_w2vbert_features_equal_the_reference_extractor(samples):
    """speakerlab.features.w2vbert against transformers' SeamlessM4TFeatureExtractor (w2v-BERT 2.0's) to 1e-4, for even
    and odd frame counts (the reference's masked last pair is the one left out) and a batch of two."""
    from transformers import SeamlessM4TFeatureExtractor

    waves = np.stack([speech_like(samples, 0), speech_like(samples, 1)[::-1].copy()])
    reference = SeamlessM4TFeatureExtractor()(list(waves), sampling_rate=16000, return_tensors="np")
    ours = W2VBertFbank()(torch.from_numpy(waves))
    frames = ours.shape[1]
    assert ours.dtype == torch.float32 and ours.shape[2] == 160
    assert reference["attention_mask"][:, :frames].all() and not reference["attention_mask"][:, frames:].any()
    np.testing.assert_allclose(ours.numpy(), reference["input_features"][:, :frames], rtol=0, atol=1e-4)


@pytest.mark.parametrize("family", EVERY_FAMILY)
def test_every_family_loads_its_directory_and_gives_every_layer(family, encoder_dirs):
    from transformers import AutoModel

    model = build_model("ssl_mhfa", pretrained=str(encoder_dirs[family]), **BACKENDS["ssl_mhfa"]).eval()
    saved = AutoModel.from_pretrained(str(encoder_dirs[family]), local_files_only=True).state_dict()
    ours = model.encoder.model.state_dict()
    assert set(ours) == set(saved) and all(torch.equal(ours[k], saved[k]) for k in saved)
    x = model_input(model)
    with torch.no_grad():
        hidden = model.encoder(x)
        assert len(hidden) == TINY_ENCODERS[family]["num_hidden_layers"] + 1
        assert model(x).shape == (2, 16)
    assert model.input_kind == ("w2vbert_fbank" if family == "wav2vec2-bert" else "waveform")


def test_missing_or_wrong_directory_says_how_to_get_the_weights(tmp_path, encoder_dirs):
    with pytest.raises(ValueError, match=f"pretrained {tmp_path / 'none'}: no config.json there; .*hf download"):
        build_model("ssl_mhfa", pretrained=str(tmp_path / "none"))
    (tmp_path / "no_weights").mkdir()
    (tmp_path / "no_weights" / "config.json").write_text((encoder_dirs["wavlm"] / "config.json").read_text())
    with pytest.raises(ValueError, match=r"no weights \(model.safetensors or .*hf download"):
        build_model("ssl_mhfa", pretrained=str(tmp_path / "no_weights"))
    with pytest.raises(ValueError, match="model_type 'bert' is not a supported encoder"):
        build_model("ssl_mhfa", encoder={"model_type": "bert"})
    with pytest.raises(ValueError, match="exactly one of pretrained"):
        build_model("ssl_mhfa")


@pytest.mark.parametrize("package", ["transformers", "peft"])
def test_missing_transformers_names_the_extra(package, monkeypatch):
    monkeypatch.setitem(sys.modules, package, None)
    with pytest.raises(ImportError, match=rf"{package}.*pip install -e \.\[ssl\]"):
        require_ssl()


@pytest.mark.parametrize("family", EVERY_FAMILY)
def test_lora_trains_only_the_adapters_and_the_back_end_and_merges(family, encoder_dirs):
    """With LoRA only adapters and back-end require gradients and enter the optimizer; the adapters act on
    the output (WavLM's included: its targets are the feed-forward layers); merging them keeps the output."""
    lora = {"r": 4, "alpha": 8}
    torch.manual_seed(0)
    model = build_model("ssl_mfa", pretrained=str(encoder_dirs[family]), lora=lora, **BACKENDS["ssl_mfa"]).eval()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n or n.startswith("backend.") for n in trainable)
    assert any(n.startswith("backend.") for n in trainable) and any("lora_" in n for n in trainable)
    head = torch.nn.Linear(16, 3)
    in_optimizer = {id(p) for g in parameter_groups(model, head, OptimSettings()) for p in g["params"]}
    expected = {id(p) for n, p in model.named_parameters() if n in trainable} | {id(p) for p in head.parameters()}
    assert in_optimizer == expected
    x = model_input(model)
    with torch.no_grad():
        before = model(x)
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_()
        adapted = model(x)
        model.merge_lora()
        merged = model(x)
    assert (adapted - before).abs().max() > 1e-3
    torch.testing.assert_close(merged, adapted, rtol=1e-4, atol=1e-5)
    assert not any("lora_" in k or "base_layer" in k for k in model.state_dict())


def test_lora_on_wavlm_attention_is_refused(encoder_dirs):
    with pytest.raises(ValueError, match=r"target_modules \['q_proj', 'v_proj'\]: wavlm's attention"):
        build_model("ssl_mhfa", pretrained=str(encoder_dirs["wavlm"]), lora={"target_modules": ["q_proj", "v_proj"]})
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['rank'\]"):
        build_model("ssl_mhfa", pretrained=str(encoder_dirs["wavlm"]), lora={"rank": 8})
    with pytest.raises(ValueError, match="model.args.lora must be a mapping"):
        build_model("ssl_mhfa", pretrained=str(encoder_dirs["wavlm"]), lora="r64")


@pytest.mark.parametrize("lora", [None, {"r": 2, "alpha": 4}])
def test_standalone_arguments_rebuild_the_model_without_its_directory(lora, encoder_dirs):
    torch.manual_seed(0)
    model = build_model(
        "ssl_ecapa_tdnn", pretrained=str(encoder_dirs["wav2vec2"]), lora=lora, **BACKENDS["ssl_ecapa_tdnn"]
    )
    args = model.standalone_args()
    assert args["pretrained"] is None and args["encoder"]["model_type"] == "wav2vec2" and args["lora"] == lora
    torch.manual_seed(1)  # other random weights: everything must come from the state dict
    rebuilt = build_model("ssl_ecapa_tdnn", **args)
    rebuilt.load_state_dict(model.state_dict())
    x = model_input(model)
    with torch.no_grad():
        torch.testing.assert_close(rebuilt.eval()(x), model.eval()(x), rtol=0, atol=0)


def test_encoder_lr_scale_and_layer_wise_decay(encoder_dirs):
    """Encoder layer i of L at encoder_lr_scale x layer_decay ** (L - i); what comes before the layers at
    depth 0; back-end and classifier at 1; 1-D weights without weight decay."""
    model = build_model("ssl_mhfa", pretrained=str(encoder_dirs["hubert"]), **BACKENDS["ssl_mhfa"])
    head = torch.nn.Linear(16, 3)
    groups = parameter_groups(model, head, OptimSettings(encoder_lr_scale=0.1, layer_decay=0.5, weight_decay=0.01))
    scale = {id(p): g["lr_scale"] for g in groups for p in g["params"]}
    decay = {id(p): g["weight_decay"] for g in groups for p in g["params"]}
    names = dict(model.named_parameters())
    assert scale[id(names["encoder.model.encoder.layers.1.attention.q_proj.weight"])] == pytest.approx(0.1)
    assert scale[id(names["encoder.model.encoder.layers.0.attention.q_proj.weight"])] == pytest.approx(0.05)
    assert scale[id(names["encoder.model.feature_extractor.conv_layers.0.conv.weight"])] == pytest.approx(0.025)
    assert scale[id(names["backend.out.weight"])] == 1.0 and scale[id(head.weight)] == 1.0
    assert decay[id(names["backend.out.weight"])] == 0.01 and decay[id(names["backend.out.bias"])] == 0.0
    assert id(names["encoder.model.masked_spec_embed"]) not in scale  # never used: not trained
    assert len(scale) == sum(p.requires_grad for p in model.parameters()) + 2


def test_encoder_settings_are_an_error_for_fbank_models():
    model = build_model("campplus", embedding_size=16, m_channels=8, num_layers=[1, 1, 1])
    with pytest.raises(ConfigError, match="'optim.layer_decay': model campplus has no self-supervised encoder"):
        check_encoder_settings(model, OptimSettings(layer_decay=0.9), "campplus")


def test_the_features_kind_must_be_the_encoders(tmp_path, encoder_dirs):
    import contextlib

    from speakerlab.train.build import build_net

    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"model: {{name: ssl_mfa, args: {{pretrained: {encoder_dirs['wav2vec2-bert']}, adapter_dim: 8}}}}\n"
        "data: {train: x}\nfeatures: {kind: waveform}\n"
    )
    with pytest.raises(
        ConfigError, match="'features.kind': the model takes w2vbert_fbank, not waveform .model ssl_mfa"
    ):
        build_net(load_config(cfg), 3, contextlib.nullcontext)
    net = build_net(load_config(cfg, ["features.kind=w2vbert_fbank"]), 3, contextlib.nullcontext)
    assert net.classifier.weight.shape == (3, 256)
    with pytest.raises(ConfigError, match="'features.kind': the model takes kaldi_fbank or redimnet_mel, not w"):
        build_net(load_config(cfg, ["model.name=campplus", "model.args={}"]), 3, contextlib.nullcontext)
    spec = feature_spec(load_config(cfg, ["features.kind=w2vbert_fbank"]).features, 16000)
    assert spec == FeatureSpec(W2VBertFbankConfig(), True) and spec.feat_dim == 160
    # A waveform encoder trained on normalised waves (do_normalize in preprocessor_config.json) needs mean_norm.
    import shutil

    wavlm = shutil.copytree(encoder_dirs["wavlm"], tmp_path / "wavlm")
    (wavlm / "preprocessor_config.json").write_text('{"do_normalize": true, "sampling_rate": 16000}')
    waves = ["model.name=ssl_mhfa", f"model.args={{pretrained: {wavlm}, heads: 2}}", "features.kind=waveform"]
    with pytest.raises(ConfigError, match="'features.mean_norm': the encoder's preprocessor_config.json has do_n"):
        build_net(load_config(cfg, [*waves, "features.mean_norm=false"]), 3, contextlib.nullcontext)
    assert build_net(load_config(cfg, waves), 3, contextlib.nullcontext).model.do_normalize is True


def test_ssl_models_are_listed_apart():
    assert list_ssl_models() == ["ssl_ecapa_tdnn", "ssl_mfa", "ssl_mhfa"]
    assert not set(list_ssl_models()) & set(list_models())


def test_training_without_transformers_stops_naming_the_extra(tmp_path, monkeypatch, capsys):
    from speakerlab.train.loop import main as train_main
    from tests.helpers import tiny_config

    _, train = tiny_config(tmp_path, val=False)
    monkeypatch.setitem(sys.modules, "transformers", None)
    monkeypatch.setitem(sys.modules, "peft", None)
    config = str(ROOT / "conf" / "mini" / "ssl_mfa.yaml")
    assert (
        train_main(["--config", config, "--exp-dir", str(tmp_path / "e"), f"data.train={train}", "data.val=null"]) == 2
    )
    assert "pip install -e .[ssl]" in capsys.readouterr().err


@pytest.mark.parametrize("backend", ["ssl_mhfa", pytest.param("ssl_ecapa_tdnn", marks=pytest.mark.slow), "ssl_mfa"])
def test_each_back_end_fits_a_batch_of_encoder_layers(backend, encoder_dirs):
    """The back-ends learn: over a fixed batch of the tiny encoder's hidden layers (4 speakers x 2), 40 AdamW steps
    with an AAM head (margin 0) bring the loss below a tenth of its start."""
    from speakerlab.train.losses.margin import AAMSoftmax

    torch.manual_seed(0)
    model = build_model(backend, pretrained=str(encoder_dirs["wavlm"]), **BACKENDS[backend])
    with torch.no_grad():
        hidden = [h.detach() for h in model.encoder.eval()(model_input(model, batch=8, samples=8000))]
    head = AAMSoftmax(16, 4, margin=0.0)
    opt = torch.optim.AdamW([*model.backend.parameters(), *head.parameters()], lr=0.005)
    labels = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    losses = []
    for _ in range(40):
        loss, _ = head(model.backend(hidden), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.1 * losses[0], losses
