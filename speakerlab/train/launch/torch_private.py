"""The private names of torch this package still relies on, each where torch has no public way to do the same, and
the start-up check that fails in one line when the installed torch has lost one:

    require("exit_barrier")    # raises TorchPrivateMissing (an ImportError, so commands print it as one error line)

What was private and is public now: the agent's store and group size come from `SimpleElasticAgent.get_worker_group()`
(its `store`, `group_world_size`) and the TCP store under a prefix store from `PrefixStore.underlying_store`. The
freeze schedule builds DDP again through its public constructor (speakerlab.train.optim.freeze), nothing private.
"""

from __future__ import annotations

import importlib
from typing import Dict, Tuple

import torch

PROVEN_ON = "2.13.0"  # the torch version these names were last checked on (the tests run against it)

# key -> (module, attribute path, who uses it and why there is no public way)
PRIVATE: Dict[str, Tuple[str, str, str]] = {
    "exit_barrier": (
        "torch.distributed.elastic.agent.server.api",
        "SimpleElasticAgent._exit_barrier",
        "speakerlab.train.launch.agent wraps it so that the store's host leaves last (pytorch/pytorch#69520; "
        "torch has no hook after the exit barrier)",
    ),
    "ddp_ignore": (
        "torch.nn.parallel",
        "DistributedDataParallel._set_params_and_buffers_to_ignore_for_model",
        "the sharded classifier (speakerlab.train.losses.sharded) keeps each rank's rows out of DDP with it "
        "(pytorch/pytorch#43690: no public API yet)",
    ),
}


class TorchPrivateMissing(ImportError):
    """The installed torch lacks a private name this package relies on (one line: what, who, which torch works)."""


def require(*keys: str) -> None:
    """Raise TorchPrivateMissing, naming the name, its user and PROVEN_ON, for the first of `keys` (of PRIVATE) that
    the installed torch does not have."""
    for key in keys:
        module, path, why = PRIVATE[key]
        found = importlib.import_module(module)
        for part in path.split("."):
            found = getattr(found, part, None)
            if found is None:
                raise TorchPrivateMissing(
                    f"torch {torch.__version__} has no {module}.{path}, which {why}; "
                    f"this code was proven on torch {PROVEN_ON}: install that version"
                )
