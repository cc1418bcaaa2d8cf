"""Every registered model: shapes, variable length, determinism, TorchScript, gradients, autocast.

Inputs are kept to batch 2 and a few hundred frames so the whole registry runs in seconds.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from speakerlab.models import build_model, list_models
from tests.helpers import registry_params

MODELS = list_models()
FEAT_DIM = 80


def _fbank(batch: int, frames: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, frames, FEAT_DIM, generator=gen)


@pytest.fixture(scope="module", params=registry_params(MODELS))
def model(request):
    torch.manual_seed(0)
    return build_model(request.param, feat_dim=FEAT_DIM).eval()


@pytest.fixture(scope="module")
def eager(model):
    """`eager(frames, seed=0)`: the model's eval-mode fp32 output `(2, D)` for `_fbank(2, frames, seed)`, computed
    once per model. The tests below compare against these same outputs instead of recomputing them (six passes
    per model); none of them leaves the model changed (the backward test restores its BatchNorm statistics)."""
    outputs = {}

    def get(frames: int, seed: int = 0) -> torch.Tensor:
        if (frames, seed) not in outputs:
            with torch.no_grad():
                outputs[frames, seed] = model(_fbank(2, frames, seed))
        return outputs[frames, seed]

    return get


# Published parameter counts in millions, as printed (a string keeps the printed precision), for each
# builder's defaults. Sources:
#   3D-Speaker README (modelscope/3D-Speaker, VoxCeleb table): ResNet34 6.34 M, ECAPA-TDNN 20.8 M,
#     ERes2Net-base 6.61 M, ERes2Net-large 22.46 M, ERes2NetV2 17.8 M;
#     egs/voxceleb/sv-cam++/README.md: CAM++ 7.18M (512-D embedding).
#   WeSpeaker examples/voxceleb/v2/README.md (wenet-e2e/wespeaker): ECAPA_TDNN_GLOB_c512-ASTP-emb192
#     6.19M, ResNet221-TSTP-emb256 23.79M, ResNet293-TSTP-emb256 28.62M, Gemini_DFResNet114 6.53M.
#   Gemini DF-ResNet183: 9.20 M, from the Golden Gemini paper (Liu et al., arXiv:2312.03620) table of
#     Gemini DF-ResNets.
PUBLISHED_MPARAMS = {
    "campplus": "7.18",
    "ecapa_tdnn_c512": "6.19",
    "ecapa_tdnn_c1024": "20.8",
    "eres2net_base": "6.61",
    "eres2net_large": "22.46",
    "eres2netv2": "17.8",
    "resnet34": "6.34",
    "resnet221": "23.79",
    "resnet293": "28.62",
    "gemini_dfresnet114": "6.53",
    "gemini_dfresnet183": "9.20",
    # ReDimNet2 README (vox2 releases), truncated to 0.1 M: tests/data/redimnet2/b*.json `published_params`.
    "redimnet2_b0": "1.1",
    "redimnet2_b1": "2.1",
    "redimnet2_b2": "3.6",
    "redimnet2_b3": "4.1",
    "redimnet2_b4": "6.6",
    "redimnet2_b5": "8.9",
    "redimnet2_b6": "12.3",
}


@pytest.mark.parametrize("name", MODELS)
def test_parameter_count_matches_published(name):
    """Within one unit of the published figure's last digit: sources both round (CAM++ 7.176 M ->
    7.18) and truncate (ERes2NetV2 17.86 M -> 17.8, ResNet293 28.626 M -> 28.62)."""
    assert name in PUBLISHED_MPARAMS, f"{name} is registered but has no published parameter count in the table"
    printed = PUBLISHED_MPARAMS[name]
    unit = 10.0 ** -len(printed.split(".")[1])
    count = sum(p.numel() for p in build_model(name).parameters())
    assert abs(count / 1e6 - float(printed)) < unit, f"{name}: {count} parameters, published {printed} M"


def test_registry_is_populated():
    for name in ["campplus", "ecapa_tdnn_c1024", "ecapa_tdnn_c512"]:
        assert name in MODELS


def test_model_exposes_feat_dim(model):
    assert isinstance(model.feat_dim, int) and model.feat_dim == FEAT_DIM


def test_forward_shape_and_lengths(eager):
    out = eager(200)
    assert out.ndim == 2 and out.shape[0] == 2
    assert torch.isfinite(out).all()
    # Lengths that are not multiples of any stride or segment size.
    for frames in (137, 331):
        other = eager(frames, seed=frames)
        assert other.shape == out.shape
        assert torch.isfinite(other).all()


def test_eval_is_deterministic(model, eager):
    """A second eval pass over the same input gives bit-equal output (the first: `eager`'s, computed once)."""
    first = eager(200)
    with torch.no_grad():
        torch.testing.assert_close(model(_fbank(2, 200)), first, rtol=0, atol=0)


# torch.jit.script still works but warns that it is deprecated in favour of torch.compile/export.
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_torchscript_matches_eager(model, eager):
    """At two lengths, the forward test's inputs: 200 frames and 137 (a multiple of no stride)."""
    scripted = torch.jit.script(model)
    for frames, seed in ((200, 0), (137, 137)):
        with torch.no_grad():
            torch.testing.assert_close(scripted(_fbank(2, frames, seed)), eager(frames, seed), rtol=1e-4, atol=1e-5)


def test_backward_gives_finite_grads(model):
    # The training-mode pass updates the BatchNorm statistics: restored after, so `eager`'s outputs stay the model's.
    buffers = {k: b.clone() for k, b in model.named_buffers()}
    model.train()
    try:
        model.zero_grad(set_to_none=True)
        out = model(_fbank(2, 200))
        # Squared output: a plain sum is constant under a final BatchNorm without affine.
        out.square().sum().backward()
        grads = [p.grad for p in model.parameters() if p.requires_grad]
        assert all(g is not None and torch.isfinite(g).all() for g in grads)
        assert any(g.abs().sum() > 0 for g in grads)
    finally:
        model.zero_grad(set_to_none=True)
        model.eval()
        with torch.no_grad():
            for k, b in model.named_buffers():
                b.copy_(buffers[k])


# The bfloat16 checks run one utterance of the forward test's 137 frames (not the batch of two at 200): on a CPU
# without bfloat16 instructions (no AVX-512) every bfloat16 op is emulated, and the deep variants took 500 of
# test_models' 636 s at batch 2 x 200 frames; one 137-frame utterance costs about a third. Rounding error grows
# with depth, which is unchanged, not with length.
def _one_utterance(eager) -> tuple[torch.Tensor, torch.Tensor]:
    """The first utterance of the 137-frame input `(1, 137, F)` and its fp32 embedding `(1, D)` (computed once)."""
    return _fbank(2, 137, seed=137)[:1], eager(137, seed=137)[:1]


def test_bfloat16_autocast(model, eager):
    """bf16 autocast gives the fp32 embedding up to bf16 rounding: it points the same way."""
    feats, ref = _one_utterance(eager)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(feats)
    assert out.shape == ref.shape and torch.isfinite(out.float()).all()
    assert torch.nn.functional.cosine_similarity(out.float(), ref, dim=1).min() > 0.99


def test_bfloat16_weights(model, eager):
    """The model cast to bfloat16 as a whole (no autocast) runs on bfloat16 input, its embedding close to fp32."""
    import copy

    feats, ref = _one_utterance(eager)
    with torch.no_grad():
        out = copy.deepcopy(model).bfloat16()(feats.bfloat16())
    assert out.dtype == torch.bfloat16 and out.shape == ref.shape and torch.isfinite(out.float()).all()
    assert torch.nn.functional.cosine_similarity(out.float(), ref, dim=1).min() > 0.98


def _is_2d_conv(model) -> bool:
    return any(isinstance(m, torch.nn.Conv2d) for m in model.modules())


def test_channels_last_matches(model, eager):
    """2-D conv models give the same embeddings with channels_last weights (eval mode: the CPU
    channels_last batch-norm kernel differs slightly in training statistics)."""
    if not _is_2d_conv(model):
        pytest.skip("a 1-D model: channels_last applies to 2-D convolutions only")
    ref = eager(200)
    with torch.no_grad():
        model.to(memory_format=torch.channels_last)
        try:
            out = model(_fbank(2, 200))
        finally:
            model.to(memory_format=torch.contiguous_format)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


# A few state-dict entries of WeSpeaker's checkpoint layout (module names and shapes of its ResNet and
# Gemini_DF_ResNet at their VoxCeleb settings: 80 bins, 256-D, one embedding layer), which the
# builders must reproduce for those checkpoints to load.
WESPEAKER_KEYS = {
    "resnet221": {
        "conv1.weight": (32, 1, 3, 3),
        "layer1.0.shortcut.0.weight": (128, 32, 1, 1),
        "layer3.47.conv3.weight": (512, 128, 1, 1),
        "layer4.2.bn3.running_var": (1024,),
        "seg_1.weight": (256, 2 * 1024 * 10),
    },
    "resnet293": {
        "layer1.9.conv2.weight": (32, 32, 3, 3),
        "layer3.63.bn1.weight": (128,),
        "layer4.0.shortcut.1.weight": (1024,),
        "seg_1.weight": (256, 2 * 1024 * 10),
    },
    "gemini_dfresnet114": {
        "downsample_layers.0.0.weight": (32, 1, 3, 3),
        "downsample_layers.4.0.weight": (256, 128, 3, 3),
        "stages.2.26.conv2.weight": (512, 1, 3, 3),
        "seg_1.weight": (256, 2 * 256 * 5),
    },
    "gemini_dfresnet183": {
        "stages.1.7.conv1.weight": (256, 64, 1, 1),
        "stages.2.44.conv3.weight": (128, 512, 1, 1),
        "seg_1.bias": (256,),
    },
}


@pytest.mark.parametrize("name", sorted(WESPEAKER_KEYS))
def test_wespeaker_state_dict_layout(name):
    state = build_model(name).state_dict()
    for key, shape in WESPEAKER_KEYS[name].items():
        assert key in state, f"{name}: no {key}"
        assert tuple(state[key].shape) == shape, f"{name}.{key}: {tuple(state[key].shape)} != {shape}"
    # One embedding layer: the second one and its BN stay parameter-free, as in those checkpoints.
    assert not any(k.startswith(("seg_2.", "seg_bn_1.")) for k in state)


def test_each_model_declares_the_input_it_takes():
    """`model_features` (what bench/, the export tests and tools build a model's front-end from): its width is the
    model's default feat_dim, and every config under conf/ that trains the model names that front-end."""
    import yaml

    from speakerlab.frontends import FeatureSettings, feature_spec
    from speakerlab.models import builder_defaults, model_features

    for name in MODELS:
        spec = feature_spec(FeatureSettings(**model_features(name)), 16000)
        assert spec.feat_dim == builder_defaults(name)["feat_dim"], name
    confs = 0
    for path in sorted(Path(__file__).resolve().parents[1].glob("conf/*/*.yaml")):
        raw = yaml.safe_load(path.read_text()) or {}
        name = (raw.get("model") or {}).get("name")
        if name in MODELS and model_features(name):
            confs += 1
            assert (raw.get("features") or {}).get("kind") == model_features(name)["kind"], path
    assert confs >= 21  # conf/{voxceleb,3dspeaker,cnceleb}/redimnet2_b*.yaml at least
