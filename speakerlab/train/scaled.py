"""Fine-tuning defaults scaled to the data: how long to train, how long the new classifier trains alone and how
long a plateau may last, from how many utterances the training dir has (egs/custom stage 3).

    speakerlab-scaled --data data/custom/train --config conf/custom/finetune.yaml [key=value ...]
    -> stdout, one override a line: train.epochs=30
                                    train.patience=10
                                    train.freeze=[{modules: [trunk], until_epoch: 6}]
                                    loss.margin_start_epoch=6
       stderr: one line saying what they were scaled to

The recipe puts these overrides before the user's (`--train_overrides`), and a key given there is not scaled
(what depends on it follows the value given: the frozen start on train.epochs, the margin's start on
train.freeze's trunk rules). With U utterances, global batch B (the config's train.global_batch_size) and
P = ceil(U / B) steps per epoch:

- train.epochs = clamp(ceil(STEPS / P), MIN_EPOCHS, MAX_EPOCHS): about STEPS optimizer steps, the length at
  which fine-tuning on a few hundred speakers stopped gaining (bench/RESULTS.md, "Fine-tuning on one's own
  data"); a small folder gets more epochs of its few steps, a large one at least MIN_EPOCHS. Model selection
  on the validation split (train.keep_best, train.patience) keeps a long run from overfitting: the best epoch
  is the result, and a plateau stops it.
- train.patience = max(3, ceil(PATIENCE_STEPS / P)) validations: about PATIENCE_STEPS steps without a lower
  validation EER before the run stops early. Counted in epochs alone, a plateau of 3 short epochs stopped a
  run of 10-step epochs in the dip that follows the thaw (the margin starting, the trunk moving): with 8 it
  went on to 22.96% test EER instead of 28.30% (bench/RESULTS.md).
- the frozen start (train.freeze's rule on trunk, with train.init only; the config's other rules kept): the
  classifier alone for about FREEZE_STEPS steps, at least one epoch and at most a quarter of them; the margin
  (loss.margin_start_epoch) starts when the trunk thaws, as in conf/custom/finetune.yaml.
- the learning rates are the config's: per optimizer step they need not change with the amount of data, and
  the trunk's share (optim.backbone_lr_scale) was measured at the small end, 58 training speakers: 0.3x (the
  config's) beat 0.1x and 1.0x on 60 voices in no folder (bench/RESULTS.md).
"""

from __future__ import annotations

import math
import sys
from typing import Dict, List, Sequence

import yaml

from speakerlab.commands import CommandParser
from speakerlab.config import ConfigError, FreezeRule, load_config
from speakerlab.dataio.tables.lists import ListError, read_utt2spk
from speakerlab.settings import parse_overrides
from speakerlab.train.optim.freeze import trunk_frozen_until

STEPS = 600  # optimizer steps a fine-tuning run aims at
MIN_EPOCHS, MAX_EPOCHS = 4, 30
FREEZE_STEPS = 60  # steps of the classifier alone
PATIENCE_STEPS = 100  # steps a plateau may last


def scaled_settings(
    utterances: int, batch: int, init: bool, given: Dict[str, object], freeze: Sequence[FreezeRule] = ()
) -> List[str]:
    """The overrides of the module docstring for U `utterances` and global `batch`; `init`: a pretrained start
    (the frozen start needs one); `freeze`: the config's train.freeze (the user's overrides applied). A key in
    `given` (an override the user set) is not scaled, and what depends on it follows its value."""
    per_epoch = math.ceil(utterances / batch)
    epochs = given.get("train.epochs") or min(MAX_EPOCHS, max(MIN_EPOCHS, math.ceil(STEPS / per_epoch)))
    out = {"train.epochs": epochs, "train.patience": max(3, math.ceil(PATIENCE_STEPS / per_epoch))}
    if init:
        if "train.freeze" in given:
            until = trunk_frozen_until(freeze, per_epoch)
            frozen = None if until == math.inf else math.ceil(until / per_epoch)
        else:
            frozen = min(max(1, int(epochs) // 4), math.ceil(FREEZE_STEPS / per_epoch))
            out["train.freeze"] = flow([*_without_trunk(freeze), {"modules": ["trunk"], "until_epoch": frozen}])
        if frozen is not None:  # a trunk frozen for the whole run: the config's margin start stays
            out["loss.margin_start_epoch"] = frozen
    return [f"{k}={v}" for k, v in out.items() if k not in given]


def _without_trunk(rules: Sequence[FreezeRule]) -> List[Dict[str, object]]:
    """The config's freeze rules as plain values, trunk taken out of them (the scaled rule replaces it)."""
    out = []
    for r in rules:
        modules = [m for m in r.modules if m != "trunk"]
        bound = {"until_epoch": r.until_epoch} if r.until_epoch is not None else {"until_step": r.until_step}
        if modules:
            out.append({"modules": modules, **bound})
    return out


def flow(rules: List[Dict[str, object]]) -> str:
    """Freeze rules as one line of YAML: `[{modules: [trunk], until_epoch: 2}]`."""
    return yaml.safe_dump(rules, default_flow_style=True, width=math.inf).strip()


def main(argv=None) -> int:
    ap = CommandParser(prog="speakerlab-scaled", description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="the training data dir (its utt2spk is counted)")
    ap.add_argument("--config", required=True, action="append", help="the training config(s), as speakerlab-train")
    ap.add_argument("overrides", nargs="*", help="dotted overrides, as speakerlab-train: keys given are not scaled")
    args = ap.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        utt2spk = read_utt2spk(f"{args.data}/utt2spk")
    except (ConfigError, ListError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    speakers = len({spk for _, spk in utt2spk.values()})
    batch = cfg.train.global_batch_size
    given = dict(parse_overrides(args.overrides))
    out = scaled_settings(len(utt2spk), batch, bool(cfg.train.init), given, cfg.train.freeze)
    print(
        f"defaults scaled to {speakers} speakers, {len(utt2spk)} utterances ({math.ceil(len(utt2spk) / batch)} "
        f"steps of {batch} per epoch): {' '.join(out)} (speakerlab/train/scaled.py)",
        file=sys.stderr,
    )
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
