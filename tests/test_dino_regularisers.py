"""RDINO's regularisers (dino.diversity_weight, dino.redundancy_weight): each penalises what it names, its gradient
reaches the embeddings, it is logged, and its settings are checked by key."""

import pytest
import torch
import torch.nn as nn

from speakerlab.config import ConfigError, load_config
from speakerlab.objectives import DinoSettings
from speakerlab.train.losses.dino import DinoObjective, diversity, redundancy


def test_collapsed_embeddings_have_a_high_diversity_loss():
    g = torch.Generator().manual_seed(0)
    spread = torch.randn(64, 16, generator=g) * 2.0
    collapsed = torch.randn(1, 16, generator=g).expand(64, 16) + 1e-3 * torch.randn(64, 16, generator=g)
    assert diversity(collapsed) > 0.9  # every dimension's std ~0: the hinge is near its maximum of 1
    assert diversity(spread) < 0.05
    # Half the dimensions collapsed: about half the penalty
    half = torch.cat([spread[:, :8], collapsed[:, 8:]], dim=1)
    assert 0.4 < diversity(half) < 0.55


def test_correlated_dimensions_have_a_high_redundancy_loss():
    g = torch.Generator().manual_seed(1)
    independent = torch.randn(4096, 8, generator=g)
    source = torch.randn(4096, 1, generator=g)
    correlated = source.expand(4096, 8) + 0.1 * torch.randn(4096, 8, generator=g)
    # Each of the 8 x 7 off-diagonal covariances is ~1 when the dimensions copy one source, ~0 (1/sqrt(N)) when not
    assert redundancy(correlated) > 5.0
    assert redundancy(independent) < 0.05
    # The same variances, the covariance alone decides it
    assert torch.allclose(correlated.var(dim=0), torch.full((8,), 1.01), atol=0.1)


def objective(**weights):
    s = DinoSettings(prototypes=8, hidden_dim=8, bottleneck_dim=4, **weights)
    return DinoObjective(s, nn.Linear(4, 4), embedding_size=6)


def test_the_weighted_terms_add_to_the_loss_and_their_gradient_reaches_the_embeddings():
    g = torch.Generator().manual_seed(2)
    logits = [torch.randn(5, 8, generator=g) for _ in range(3)]
    unit = nn.functional.normalize(torch.randn(5, 6, generator=g), dim=-1)
    emb = (torch.randn(1, 6, generator=g) + 0.01 * torch.randn(5, 6, generator=g)).requires_grad_()
    plain = objective().loss(logits, logits[:2], unit, emb)
    assert plain.grad_fn is None  # unweighted: nothing reaches the embeddings (the logits are leaves here)
    obj = objective(diversity_weight=2.0, redundancy_weight=0.2)
    weighted = obj.loss(logits, logits[:2], unit, emb)
    expected = plain + 2.0 * diversity(emb) + 0.2 * redundancy(emb)
    torch.testing.assert_close(weighted, expected)
    weighted.backward()
    assert emb.grad is not None and emb.grad.abs().sum() > 0
    # A step along the gradient spreads the nearly collapsed embeddings: the diversity loss falls
    with torch.no_grad():
        assert diversity(emb - 0.5 * emb.grad) < diversity(emb)
    scalars = obj.scalars()
    assert scalars["diversity_loss"] == pytest.approx(float(diversity(emb.detach())), rel=1e-5)
    assert scalars["redundancy_loss"] == pytest.approx(float(redundancy(emb.detach())), rel=1e-5)


@pytest.mark.parametrize("key", ["diversity_weight", "redundancy_weight"])
def test_a_negative_weight_is_an_error_naming_its_key(key):
    with pytest.raises(ConfigError, match=f"'dino.{key}' must be >= 0"):
        load_config(overrides=[f"dino.{key}=-1"])
