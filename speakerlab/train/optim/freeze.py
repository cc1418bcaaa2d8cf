"""Which parts of the network take no gradient at a step: the `train.freeze` rules (speakerlab.config FreezeRule),
applied here only, before every optimizer step.

    train.freeze:
      - {modules: [trunk], until_epoch: 1}        # the embedding model (the classifier trains)
      - {modules: [encoder], until_step: 2000}    # a self-supervised model's encoder (its back-end trains)
      - {modules: [encoder], until_epoch: end}    # ... for the whole run

Every rule holds from step 0 until its bound. The frozen parameters at step s are the union of the parts of the
rules that hold at s (`trunk` contains the encoder): a function of s and the steps per epoch alone, so it does not
depend on which rule ends first, nor on whether the run was resumed. `apply_freeze` sets `requires_grad` of every
parameter the optimizer holds from that set alone, and wraps DDP again only when the set changed (DDP reduces the
parameters that require grad when it is built). A frozen parameter gets no gradient (`zero_grad(set_to_none=True)`
after each step), so the optimizer leaves it alone: no weight decay, no momentum. A frozen trunk is in eval mode
(BatchNorm statistics kept, dropout off); a frozen encoder is SSLEncoder.set_frozen's (eval mode too).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, Dict, FrozenSet, Iterable, List, Mapping, Sequence

from speakerlab.config import ConfigError, FreezeRule

if TYPE_CHECKING:  # torch only where parameters are touched: speakerlab-scaled reads the schedule without it
    import torch.nn as nn

# config.FREEZE_PARTS -> the parameters of the embedding model each names.
PARTS: Dict[str, Callable[[nn.Module], Iterable[nn.Parameter]]] = {
    "trunk": lambda model: model.parameters(),
    "encoder": lambda model: model.encoder_parameters(),
}


def rule_end(rule: FreezeRule, steps_per_epoch: int) -> float:
    """The first optimizer step the rule no longer holds at (inf: the whole run)."""
    if rule.until_epoch == "end":
        return math.inf
    return rule.until_step if rule.until_step is not None else rule.until_epoch * steps_per_epoch


def trunk_frozen_until(rules: Sequence[FreezeRule], steps_per_epoch: int) -> float:
    """The first optimizer step the whole embedding model trains at (0: no trunk rule; inf: never): until then
    it is the start's (speakerlab.train.state.selection, speakerlab.train.scaled)."""
    return max((rule_end(r, steps_per_epoch) for r in rules if "trunk" in r.modules), default=0)


def frozen_parts(rules: Sequence[FreezeRule], step: int, steps_per_epoch: int) -> FrozenSet[str]:
    """The parts frozen at optimizer step `step`: those of every rule that still holds."""
    return frozenset(m for r in rules if step < rule_end(r, steps_per_epoch) for m in r.modules)


def check_freeze(rules: Sequence[FreezeRule], model: nn.Module, total_steps: int, name: str) -> None:
    """What the config alone cannot tell: a part the model has, a bound in steps within the run."""
    from speakerlab.train.optim.groups import has_encoder

    for i, rule in enumerate(rules):
        if "encoder" in rule.modules and not has_encoder(model):
            raise ConfigError(
                f"config key 'train.freeze[{i}].modules': model {name} has no self-supervised encoder; "
                "remove encoder (trunk: the whole embedding model)"
            )
        if rule.until_step is not None and rule.until_step > total_steps:
            raise ConfigError(
                f"config key 'train.freeze[{i}].until_step' ({rule.until_step}) is beyond the run's {total_steps} "
                "steps (train.epochs x steps per epoch); the whole run: until_epoch: end"
            )


def describe(rules: Sequence[FreezeRule], parts: FrozenSet[str], steps_per_epoch: int) -> str:
    """`trunk until step 2, encoder until step 5` (the frozen parts, each with its last rule's end)."""
    if not parts:
        return "nothing frozen"
    ends = {m: max(rule_end(r, steps_per_epoch) for r in rules if m in r.modules) for m in parts}
    return "frozen: " + ", ".join(
        f"{m} until {'the end' if ends[m] == math.inf else f'step {ends[m]}'}" for m in sorted(parts)
    )


def same_freeze(a: Sequence[Mapping], b: Sequence[Mapping]) -> bool:
    """Whether two train.freeze values (plain config lists) freeze alike: the same (part, bound) pairs, listed
    in any order or grouped into any rules."""

    def pairs(rules):
        return {(m, r.get("until_epoch"), r.get("until_step")) for r in rules for m in r.get("modules", [])}

    return pairs(a) == pairs(b)


def apply_freeze(run) -> None:
    """The freeze of `run.state.step` on `run` (speakerlab.train.build.Run, not imported: build imports this
    module): requires_grad of the optimizer's parameters, train / eval modes, and DDP wrapped again when the
    trainable set changed."""
    from speakerlab.train.launch.distributed import wrap_ddp
    from speakerlab.train.optim.groups import has_encoder

    model, rules, spe = run.raw.model, run.cfg.train.freeze, run.steps_per_epoch
    parts = frozen_parts(rules, run.state.step, spe)
    frozen = {id(p) for m in parts for p in PARTS[m](model)}
    params: List[nn.Parameter] = [p for g in run.optimizer.param_groups for p in g["params"]]
    changed = [p for p in params if p.requires_grad == (id(p) in frozen)]
    for p in changed:
        p.requires_grad_(id(p) not in frozen)
    if has_encoder(model) and model.encoder_frozen != bool(parts):  # either part holds the encoder
        model.set_encoder_frozen(bool(parts))
    train = run.raw.training and "trunk" not in parts  # train_epoch puts the whole net in train mode
    if model.training != train:
        model.train(train)
    if changed:
        run.net = wrap_ddp(run.raw, run.info, run.device)
        run.monitor.log(f"step {run.state.step}: {describe(rules, parts, spe)}")
