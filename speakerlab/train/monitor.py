"""What a run reports: a plain-text log, tensorboard scalars and a progress bar (main process only)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Dict, Optional, Union

import torch

from speakerlab.outputs import write_lines


class Monitor:
    """Writes `<exp>/train.log` and tensorboard events under `<exp>/tensorboard` on the main process.

    Nothing is written to the exp dir before `start()`: lines logged while a run is still being set up
    are printed and kept, then written when the run is known to start (a failed start leaves the exp
    dir as it was). Other ranks get a Monitor that drops everything, so callers need no rank checks.
    """

    def __init__(self, exp_dir: Path, enabled: bool = True, tensorboard: bool = True):
        self.enabled = enabled
        self._log_file = None
        self._pending = []
        self._tb = None
        self._texts = []  # (tag, text) for tensorboard, written once its writer is open
        self._bar = None
        self._console = True  # False once stderr's reader is gone
        self.exp_dir, self._want_tb = exp_dir, tensorboard

    def start(self) -> None:
        """Open `<exp>/train.log` and write the lines logged so far."""
        if not self.enabled or self._log_file is not None:
            return
        self.exp_dir.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.exp_dir / "train.log", "a", buffering=1)
        for line in self._pending:
            self._log_file.write(line + "\n")
        self._pending = []

    def resume_at(self, step: int) -> None:
        """Forget what an interrupted run logged after `step` (it is about to be recomputed):
        tensorboard purges those events, metrics.jsonl drops those lines."""
        if not self.enabled:
            return
        self._open_tb(purge_step=step)
        path = self.exp_dir / "metrics.jsonl"
        if path.exists():
            import json

            kept = [ln for ln in path.read_text().splitlines() if ln and json.loads(ln)["step"] <= step]
            write_lines(path, kept)

    def _open_tb(self, purge_step=None) -> None:
        if self._tb is None and self._want_tb:
            from torch.utils.tensorboard import SummaryWriter  # imported here: slow, main rank only

            self._tb = SummaryWriter(log_dir=str(self.exp_dir / "tensorboard"), purge_step=purge_step)
            for tag, text in self._texts:
                self._tb.add_text(tag, text, purge_step or 0)
            self._texts = []

    def metrics(self, values: Dict[str, float], step: int, **extra) -> None:
        """Append one line to `<exp>/metrics.jsonl` (what tests and scripts read)."""
        if self.enabled:
            import json

            with open(self.exp_dir / "metrics.jsonl", "a") as f:
                f.write(json.dumps({"step": step, **extra, **values}) + "\n")

    def log(self, message: str) -> None:
        if not self.enabled:
            return
        line = f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {message}"
        if self._log_file is None:
            self._pending.append(line)
        else:
            self._log_file.write(line + "\n")
        if not self._console:
            return
        try:
            if self._bar is not None:
                self._bar.write(line, file=sys.stderr)
            else:
                print(line, file=sys.stderr, flush=True)
        except OSError:
            # The reader of stderr is gone (`... | tee log` ended by the same Ctrl-C that asked the run to stop):
            # train.log keeps every line, and the run goes on to its checkpoint instead of dying of a write.
            self._console = False

    def text(self, tag: str, text: str) -> None:
        """A text entry in tensorboard (the run's settings), written when the event file opens."""
        if not self.enabled:
            return
        if self._tb is None:
            self._texts.append((tag, text))
        else:
            self._tb.add_text(tag, text)

    def scalars(self, values: Dict[str, float], step: int, prefix: str = "train") -> None:
        if not self.enabled:
            return
        self._open_tb()
        if self._tb is None:
            return
        for name, value in values.items():
            self._tb.add_scalar(f"{prefix}/{name}", value, step)

    def progress(self, total: int, initial: int, desc: str):
        """A tqdm bar on the main process (None elsewhere); closed by `end_progress`."""
        if not self.enabled:
            return None
        from tqdm import tqdm

        self._bar = tqdm(
            total=total, initial=initial, desc=desc, dynamic_ncols=True, leave=False, disable=not sys.stderr.isatty()
        )
        return self._bar

    def end_progress(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def close(self) -> None:
        self.end_progress()
        if self._tb is not None:
            self._tb.close()
        if self._log_file is not None:
            self._log_file.close()


class Meter:
    """Running sums of per-step metrics between two log points, over the steps taken (a skipped step's values
    count nothing). A tensor value is summed where it is (the training step's, on the device), masked there by
    the step's `taken` flag: it is read on the host by `means`, at a log point only."""

    def __init__(self):
        self.sums: Dict[str, object] = {}
        self.count = 0  # steps added, taken or not
        self.taken: Union[float, torch.Tensor] = 0.0

    def add(self, taken: Union[bool, torch.Tensor] = True, **values) -> None:
        for k, v in values.items():
            v = v.detach().double() if isinstance(v, torch.Tensor) else float(v)
            if isinstance(taken, torch.Tensor):
                v = torch.where(taken, v, 0.0)  # not a product: a skipped step's NaN x 0 is NaN
            elif not taken:
                v = 0.0
            self.sums[k] = self.sums[k] + v if k in self.sums else v
        self.count += 1
        self.taken = self.taken + (taken.double() if isinstance(taken, torch.Tensor) else float(taken))

    def means(self) -> Optional[Dict[str, float]]:
        """The mean of each value over the steps taken; None when none was."""
        taken = float(self.taken)
        return {k: float(v) / taken for k, v in self.sums.items()} if taken else None

    def reset(self) -> Optional[Dict[str, float]]:
        out = self.means() if self.count else None
        self.sums, self.count, self.taken = {}, 0, 0.0
        return out
