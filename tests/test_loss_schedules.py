import math

import pytest
import torch
import torch.nn.functional as F

from speakerlab.train.losses.margin import AAMSoftmax, SphereFace2
from speakerlab.train.optim.schedules import lr_at, margin_at


def test_aam_logits_apply_margin_to_target_only():
    torch.manual_seed(0)
    head = AAMSoftmax(8, 5, scale=10.0, margin=0.3)
    emb, labels = torch.randn(4, 8), torch.tensor([0, 1, 2, 3])
    loss, cos = head(emb, labels)
    want_cos = F.normalize(emb) @ F.normalize(head.weight).T
    torch.testing.assert_close(cos, want_cos)
    theta = torch.acos(want_cos.clamp(-1, 1))
    logits = 10.0 * want_cos.clone()
    idx = torch.arange(4)
    tgt = theta[idx, labels] + 0.3
    logits[idx, labels] = 10.0 * torch.where(tgt < math.pi, torch.cos(tgt), want_cos[idx, labels] - 0.3 * math.sin(0.3))
    torch.testing.assert_close(loss, F.cross_entropy(logits, labels), rtol=1e-5, atol=1e-5)


def test_margin_raises_loss_and_is_settable():
    torch.manual_seed(1)
    head = AAMSoftmax(8, 5, margin=0.0)
    emb, labels = torch.randn(16, 8), torch.randint(0, 5, (16,))
    l0, _ = head(emb, labels)
    head.set_margin(0.2)
    l1, _ = head(emb, labels)
    assert l1 > l0
    assert head.state_dict()["margin"].item() == pytest.approx(0.2)


def test_aam_is_fp32_under_bf16_autocast():
    head = AAMSoftmax(8, 5, margin=0.2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, cos = head(torch.randn(4, 8, dtype=torch.bfloat16), torch.tensor([0, 1, 2, 3]))
    assert loss.dtype == torch.float32 and cos.dtype == torch.float32


def _sphereface2_by_loop(emb, weight, bias, labels, scale, margin, lam, t):
    """SphereFace2-C loss written out sample by sample and class by class, in float64 Python scalars:
    g(c) = 2((c + 1) / 2)^t - 1; target logit scale*(g - m) + b, others scale*(g + m) + b;
    loss = mean_i [lam * log(1 + exp(-z_iy)) + (1 - lam) * sum_{j != y} log(1 + exp(z_ij))]
    (the paper's formula times `scale`, as WeSpeaker trains it)."""
    total = 0.0
    for i in range(emb.shape[0]):
        e = emb[i].double() / emb[i].double().norm()
        for j in range(weight.shape[0]):
            w = weight[j].double() / weight[j].double().norm()
            c = min(1.0, max(-1.0, float(e @ w)))
            g = 2.0 * ((c + 1.0) / 2.0) ** t - 1.0
            if j == int(labels[i]):
                total += lam * math.log1p(math.exp(-(scale * (g - margin) + bias)))
            else:
                total += (1.0 - lam) * math.log1p(math.exp(scale * (g + margin) + bias))
    return total / emb.shape[0]


@pytest.mark.parametrize("margin,t,bias", [(0.2, 3, 0.0), (0.35, 2, -1.5), (0.0, 1, 0.7)])
def test_sphereface2_matches_per_class_loop(margin, t, bias):
    torch.manual_seed(2)
    head = SphereFace2(8, 5, scale=16.0, margin=margin, lam=0.7, t=t)
    with torch.no_grad():
        head.bias.fill_(bias)
    emb, labels = torch.randn(6, 8), torch.tensor([0, 1, 2, 3, 4, 2])
    loss, cos = head(emb, labels)
    torch.testing.assert_close(cos, F.normalize(emb) @ F.normalize(head.weight).T)
    want = _sphereface2_by_loop(emb, head.weight.detach(), bias, labels, 16.0, margin, 0.7, t)
    assert loss.item() == pytest.approx(want, rel=1e-5)


def test_sphereface2_margin_is_settable_and_raises_loss():
    torch.manual_seed(3)
    head = SphereFace2(8, 5, margin=0.0)
    emb, labels = torch.randn(16, 8), torch.randint(0, 5, (16,))
    l0, _ = head(emb, labels)
    head.set_margin(0.2)
    l1, _ = head(emb, labels)
    assert l1 > l0
    assert head.state_dict()["margin"].item() == pytest.approx(0.2)
    assert set(head.state_dict()) == {"weight", "bias", "margin"}


def test_sphereface2_backward_and_fp32_under_bf16_autocast():
    head = SphereFace2(8, 5)
    emb = torch.randn(4, 8, dtype=torch.bfloat16, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, cos = head(emb, torch.tensor([0, 1, 2, 3]))
    assert loss.dtype == torch.float32 and cos.dtype == torch.float32
    loss.backward()
    for g in (emb.grad, head.weight.grad, head.bias.grad):
        assert g is not None and torch.isfinite(g.float()).all() and g.abs().sum() > 0


def test_sphereface2_rejects_bad_hyperparameters():
    with pytest.raises(ValueError, match="lam"):
        SphereFace2(8, 5, lam=1.0)
    with pytest.raises(ValueError, match="t must be"):
        SphereFace2(8, 5, t=0)


def test_lr_schedule_shape():
    total, warm, peak, low = 100, 10, 1.0, 0.01
    lrs = [lr_at(s, total, warm, peak, low) for s in range(total + 1)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a <= b for a, b in zip(lrs[:10], lrs[1:10]))  # warmup rises
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))  # cosine falls
    assert lrs[total] == pytest.approx(low)
    assert lrs[55] == pytest.approx(low + 0.5 * (peak - low))  # half way through the decay


def test_margin_schedule():
    assert margin_at(0, 10, 0.2, start_epoch=1, warmup_epochs=2) == 0.0
    assert margin_at(9, 10, 0.2, 1, 2) == 0.0
    assert margin_at(20, 10, 0.2, 1, 2) == pytest.approx(0.1)
    assert margin_at(30, 10, 0.2, 1, 2) == pytest.approx(0.2)
    assert margin_at(99, 10, 0.2, 1, 2) == pytest.approx(0.2)
    assert margin_at(0, 10, 0.3, 0, 0) == pytest.approx(0.3)


def test_schedules_depend_on_global_step_only():
    """Same global batch on 1 process, 4 ranks or 4 accumulation steps: the same steps per epoch, and
    optimizer step k sees the same utterances and crops, so LR and margin (functions of the global step
    and steps per epoch) meet the same data."""
    from speakerlab.dataio.loaders.batches import GlobalBatchSampler

    one = GlobalBatchSampler(1000, 64, 64, 1, 0, 1, seed=3)
    ranks = [GlobalBatchSampler(1000, 64, 16, 1, r, 4, seed=3) for r in range(4)]
    acc = GlobalBatchSampler(1000, 64, 16, 4, 0, 1, seed=3)
    assert one.steps_per_epoch == ranks[0].steps_per_epoch == acc.steps_per_epoch == 15
    for s in (one, acc, *ranks):
        s.set_epoch(2)
    by_one = [sorted(b) for b in one]
    by_ranks = [sorted(sum(parts, [])) for parts in zip(*(list(r) for r in ranks))]
    micro = list(acc)
    by_acc = [sorted(sum(micro[4 * k : 4 * k + 4], [])) for k in range(15)]
    assert by_one == by_ranks == by_acc
    assert len({i for b in by_one for i, _ in b}) == 15 * 64  # no utterance twice within the epoch
    lrs = [lr_at(k, 150, 15, 0.1, 1e-4) for k in range(150)]
    margins = [margin_at(k, one.steps_per_epoch, 0.2, 1, 2) for k in range(150)]
    assert lrs == [lr_at(k, 10 * acc.steps_per_epoch, acc.steps_per_epoch, 0.1, 1e-4) for k in range(150)]
    assert margins == [margin_at(k, ranks[3].steps_per_epoch, 0.2, 1, 2) for k in range(150)]
