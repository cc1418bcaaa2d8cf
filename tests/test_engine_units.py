import contextlib

import pytest
import torch

from speakerlab.config import ConfigError, load_config
from speakerlab.train.batch_plan import find_max_batch, plan_batches
from speakerlab.train.build import build_net, build_optimizer
from speakerlab.train.loss import AAMSoftmax, SphereFace2
from speakerlab.train.precision import resolve_precision


def test_precision_gets_device_type_from_any_device_string():
    """autocast/GradScaler need 'cuda'/'cpu', never 'cuda:0': Precision stores the normalised type."""
    p = resolve_precision("bf16", "cpu:0")
    assert p.device_type == "cpu"
    with p.autocast():
        assert torch.nn.Linear(4, 4)(torch.randn(2, 4)).dtype == torch.bfloat16
    assert p.grad_scaler()._device == "cpu"


def test_precision_resolution_on_cpu(tmp_path, monkeypatch):
    from speakerlab.train import precision

    info = tmp_path / "cpuinfo"
    info.write_text("processor : 0\nflags : fpu sse2 avx2 avx512f\n")
    assert precision.cpu_bf16_instructions(str(info)) is None
    assert precision.cpu_bf16_instructions(str(tmp_path / "absent")) is None
    info.write_text("processor : 0\nflags : fpu avx512f avx512_bf16\n")
    flag = precision.cpu_bf16_instructions(str(info))
    assert flag == "avx512_bf16"
    monkeypatch.setattr(precision, "cpu_bf16_instructions", lambda: None)
    p = resolve_precision("auto", "cpu")
    assert p.name == "fp32" and "no bf16 instructions" in p.describe()
    monkeypatch.setattr(precision, "cpu_bf16_instructions", lambda: flag)
    p = resolve_precision("auto", "cpu")
    assert p.name == "bf16" and p.describe() == "precision bf16 on cpu (auto: the CPU has avx512_bf16)"
    p = resolve_precision("bf16", "cpu")
    assert p.dtype == torch.bfloat16 and p.device_type == "cpu" and not p.use_scaler
    with p.autocast():
        assert torch.nn.Linear(4, 4)(torch.randn(2, 4)).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="fp16 needs a CUDA device"):
        resolve_precision("fp16", "cpu")
    scaler = resolve_precision("fp32", "cpu").grad_scaler()
    assert not scaler.is_enabled()


@pytest.mark.parametrize(
    "world,maxb,want", [(1, 128, (128, 2)), (4, 64, (64, 1)), (1, 48, (32, 8)), (2, 16, (16, 8)), (4, 128, (64, 1))]
)
def test_plan_batches(world, maxb, want):
    plan = plan_batches(256, world, maxb)
    assert (plan.per_device, plan.accumulation) == want
    assert plan.per_device * plan.accumulation * world == 256


def test_plan_uneven_split_is_a_clear_error():
    with pytest.raises(ValueError, match="256 is not divisible by 3 processes; use 255 or 258"):
        plan_batches(256, 3, 64)


def test_auto_batch_with_fake_memory_limit():
    """Fake card: 10 GiB usable, 1 GiB fixed + 150 MiB per sample; the search must pick 48."""
    gib = 2**30
    tried = []

    def fits(batch):
        tried.append(batch)
        return 1 * gib + batch * 150 * 2**20 <= 10 * gib

    best = find_max_batch(fits)
    assert best == 48 and tried[0] == 128
    plan = plan_batches(256, 2, best)
    assert (plan.per_device, plan.accumulation) == (32, 4)
    assert plan.describe() == "global 256 = 2 device(s) x 32 x accum 4"
    assert find_max_batch(lambda b: False) is None


# A CAM++ small enough for a training step in well under a second.
_TINY_CAMPPLUS = {
    "embedding_size": 16,
    "growth_rate": 8,
    "init_channels": 16,
    "m_channels": 4,
    "fcm_blocks": [1, 1],
    "num_layers": [1, 1, 1],
}


@pytest.mark.parametrize("name,head", [("aam", AAMSoftmax), ("sphereface2", SphereFace2)])
def test_build_net_picks_the_loss_head_and_trains_one_step(name, head):
    cfg = load_config(
        raw={
            "model": {"name": "campplus", "args": _TINY_CAMPPLUS},
            "data": {"train": "x"},
            "loss": {"name": name, "sphereface2_t": 2},
        }
    )
    torch.manual_seed(0)
    net = build_net(cfg, num_speakers=7, autocast=contextlib.nullcontext)
    assert type(net.classifier) is head
    net.classifier.set_margin(0.2)
    loss, cos = net(torch.randn(4, 120, 80), torch.tensor([0, 3, 6, 3]))
    assert cos.shape == (4, 7) and torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in net.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    opt = build_optimizer(cfg, net)
    before = net.classifier.weight.detach().clone()
    opt.step()
    assert not torch.equal(before, net.classifier.weight)
    if name == "sphereface2":  # the shared bias is a bias: no weight decay
        no_decay = [p for g in opt.param_groups if g["weight_decay"] == 0.0 for p in g["params"]]
        assert any(p is net.classifier.bias for p in no_decay)


def test_unknown_loss_name_is_a_config_error():
    with pytest.raises(ConfigError, match="loss.name"):
        load_config(raw={"model": {"name": "campplus"}, "data": {"train": "x"}, "loss": {"name": "softmax"}})
