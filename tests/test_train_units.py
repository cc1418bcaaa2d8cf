import contextlib

import pytest
import torch
from torch import nn

from speakerlab.config import ConfigError, load_config
from speakerlab.train.build import build_net, build_optimizer
from speakerlab.train.hardware.batch_plan import MemoryProbe, find_max_batch, plan_batches, probe_sizes
from speakerlab.train.hardware.precision import resolve_precision
from speakerlab.train.losses.margin import AAMSoftmax, SphereFace2
from speakerlab.train.monitor import Meter
from speakerlab.train.optim.stability import step_unless


def test_precision_gets_device_type_from_any_device_string():
    """autocast/GradScaler need 'cuda'/'cpu', never 'cuda:0': Precision stores the normalised type."""
    p = resolve_precision("bf16", "cpu:0")
    assert p.device_type == "cpu"
    with p.autocast():
        assert torch.nn.Linear(4, 4)(torch.randn(2, 4)).dtype == torch.bfloat16
    assert p.grad_scaler()._device == "cpu"


def test_precision_resolution_on_cpu(tmp_path, monkeypatch):
    from speakerlab.train.hardware import precision

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
    """Fake card: 10 GiB usable, 1 GiB fixed + 150 MiB per sample; of the plan's micro batches the search
    must pick 32 (64 needs 10.4 GiB)."""
    gib = 2**30
    tried = []

    def fits(batch):
        tried.append(batch)
        return 1 * gib + batch * 150 * 2**20 <= 10 * gib

    sizes = probe_sizes(128, upper=128)
    best = find_max_batch(fits, sizes)
    assert best == 32 and tried == [128, 64, 32]
    plan = plan_batches(256, 2, best)
    assert (plan.per_device, plan.accumulation) == (32, 4)
    assert plan.describe() == "global 256 = 2 device(s) x 32 x accum 4"
    assert find_max_batch(lambda b: False, sizes) is None


@pytest.mark.parametrize(
    "share,upper,want",
    [
        (256, 128, [128, 64, 32, 16]),
        (256, 1024, [256, 128, 64, 32, 16]),
        (300, 512, [300, 150, 100, 75, 60, 50, 30, 25, 20, 15]),
        (8, 128, [8]),
    ],
)
def test_probe_sizes_are_the_micro_batches_a_plan_can_use(share, upper, want):
    sizes = probe_sizes(share, upper)
    assert sizes == want
    for size in sizes:  # each one is a plan's micro batch as it is
        assert plan_batches(share, 1, size).per_device == size


class FakeMemory:
    """A card of `usable` bytes where a step needs `per_sample` bytes per row of the last batch the net saw."""

    def __init__(self, usable, per_sample):
        self._usable, self.per_sample, self.last = usable, per_sample, 0

    def __deepcopy__(self, memo):  # the probe's copy of the net reports to this same card
        return self

    def usable(self):
        return self._usable

    def start(self):
        self.last = 0

    def peak(self):
        return self.last * self.per_sample


class Metered(torch.nn.Module):
    """The net, telling the fake memory its batch; batches above `fail_above` fail like cuBLAS does."""

    def __init__(self, net, memory, fail_above=None, error="CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling"):
        super().__init__()
        self.net, self.memory, self.fail_above, self.error = net, memory, fail_above, error

    def forward(self, feats, labels):
        self.memory.last = feats.shape[0]
        if self.fail_above is not None and feats.shape[0] > self.fail_above:
            raise RuntimeError(self.error)
        return self.net(feats, labels)


def test_memory_probe_leaves_the_trained_net_and_the_random_streams_alone():
    cfg = load_config(raw={"model": {"name": "campplus", "args": _TINY_CAMPPLUS}, "data": {"train": "x"}})
    torch.manual_seed(0)
    net = build_net(cfg, num_speakers=5, autocast=contextlib.nullcontext)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    rng = torch.get_rng_state()
    memory = FakeMemory(usable=100, per_sample=2)  # budget 0.85 x 100: batches up to 42 fit
    probe = MemoryProbe(Metered(net, memory), (60, 80), 5, torch.device("cpu"), 0.85, memory)
    assert find_max_batch(probe, [64, 32, 16]) == 32
    assert "64: too large" in probe.describe() and "32: fits" in probe.describe()
    after = net.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # BN running statistics included
    assert any("running_mean" in k for k in before)
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(p.grad is None for p in net.parameters())


def test_memory_probe_counts_every_allocation_failure_as_too_large_and_nothing_else():
    cfg = load_config(raw={"model": {"name": "campplus", "args": _TINY_CAMPPLUS}, "data": {"train": "x"}})
    net = build_net(cfg, num_speakers=5, autocast=contextlib.nullcontext)
    memory = FakeMemory(usable=10**9, per_sample=1)
    probe = MemoryProbe(Metered(net, memory, fail_above=16), (60, 80), 5, torch.device("cpu"), 0.85, memory)
    assert find_max_batch(probe, [32, 16]) == 16 and "32: allocation failed" in probe.describe()
    probe = MemoryProbe(
        Metered(net, memory, 16, "CUDNN_STATUS_BAD_PARAM"), (60, 80), 5, torch.device("cpu"), 0.85, memory
    )
    with pytest.raises(RuntimeError, match="BAD_PARAM"):  # a real error is not "too large"
        probe(32)


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
    loss, top1 = net(torch.randn(4, 120, 80), torch.tensor([0, 3, 6, 3]))
    assert top1.shape == (4,) and net.classifier.weight.shape[0] == 7 and torch.isfinite(loss)
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


@pytest.mark.parametrize(
    "cls,kwargs",
    [
        (torch.optim.SGD, {"momentum": 0.9, "nesterov": True, "weight_decay": 1e-2}),
        (torch.optim.Adam, {"weight_decay": 1e-2}),
        (torch.optim.AdamW, {"weight_decay": 1e-2}),
    ],
)
def test_a_step_skipped_on_the_device_equals_a_step_not_taken(cls, kwargs):
    """The fused optimizers under step_unless: a skipped step (the first one too) leaves weights, momentum,
    moments and Adam's step count as if step() had not been called, bit for bit; the taken ones update."""
    torch.manual_seed(0)
    shapes = [(5, 3), (4,)]
    skipped = [
        nn.ParameterList([nn.Parameter(torch.randn(*s)) for s in shapes]) for _ in range(2)
    ]  # [on the device, reference]
    skipped[1].load_state_dict(skipped[0].state_dict())
    opts = [cls(list(ps), lr=0.1, fused=True, **kwargs) for ps in skipped]
    grads = [[torch.randn(*s) for s in shapes] for _ in range(5)]
    for i, bad in enumerate([True, False, True, True, False]):
        for ps in skipped:
            for p, g in zip(ps, grads[i]):
                p.grad = g.clone()
        before = [p.detach().clone() for p in skipped[0]]
        step_unless(opts[0], torch.tensor(bad))
        if not bad:
            opts[1].step()
        assert all(torch.equal(a, b) for a, b in zip(skipped[0], skipped[1])), (cls, i)
        assert all(torch.equal(a, b) for a, b in zip(skipped[0], before)) == bad, (cls, i)
        for p, q in zip(skipped[0], skipped[1]):
            s, r = opts[0].state[p], opts[1].state[q]
            for key in ("momentum_buffer", "exp_avg", "exp_avg_sq", "step"):
                if r.get(key) is not None:
                    assert torch.equal(s[key], r[key]), (cls, i, key)
    assert not hasattr(opts[0], "found_inf")


def test_the_optimizer_is_fused_on_the_cpu():
    cfg = load_config(raw={"model": {"name": "campplus", "args": _TINY_CAMPPLUS}, "data": {"train": "x"}})
    net = build_net(cfg, num_speakers=7, autocast=contextlib.nullcontext)
    assert build_optimizer(cfg, net).defaults["fused"]


def test_the_meter_leaves_a_skipped_steps_values_out_on_the_device():
    meter = Meter()
    meter.add(torch.tensor(True), loss=torch.tensor(2.0), grad_norm=torch.tensor(1.0))
    meter.add(torch.tensor(False), loss=torch.tensor(float("nan")), grad_norm=torch.tensor(float("inf")))
    meter.add(torch.tensor(True), loss=torch.tensor(4.0), grad_norm=torch.tensor(3.0))
    assert meter.count == 3 and meter.reset() == {"loss": 3.0, "grad_norm": 2.0}
    meter.add(torch.tensor(False), loss=torch.tensor(float("nan")))
    assert meter.reset() is None  # no step taken: nothing to log


def test_the_grad_scaler_lowers_its_scale_on_an_overflow_the_device_skipped():
    """The fp16 path of the training step, on the CPU: unscale, clip, step_unless on the norm's verdict, then the
    scaler's update. An overflowing step leaves the weights and halves the scale; a finite one updates them."""
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    for overflow in (True, False):
        before = [p.detach().clone() for p in model.parameters()]
        loss = model(torch.randn(3, 4)).square().sum() * (float("inf") if overflow else 1.0)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        scale = scaler.get_scale()
        step_unless(opt, ~torch.isfinite(norm))
        scaler.update()
        opt.zero_grad(set_to_none=True)
        same = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
        assert same == overflow and scaler.get_scale() == (scale / 2 if overflow else scale), overflow
