"""The libraries' noise while exporting, silenced: apart from graph.py so that speakerlab-export starts (and says what
it lacks in one line) in an environment without onnx."""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator


class _Advice(logging.Filter):
    """Drops onnxruntime.quantization's advice to pre-process the model (logged on the root logger at every
    call): the graph is quantised as it is, on purpose, and the int8 check says how well that went."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "pre-processing before quantization" not in record.getMessage()


@contextlib.contextmanager
def quiet_libraries() -> Iterator[None]:
    """While exporting: torch.onnx's "torchvision is not installed. Skipping torchvision::..." warnings (ops of a
    package this project never uses, one line per op and export) and onnxruntime's pre-processing advice are
    silenced, so that the command prints its own lines only; every other library message passes."""
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")
    level, advice, root = registration.level, _Advice(), logging.getLogger()
    registration.setLevel(logging.ERROR)
    root.addFilter(advice)
    try:
        yield
    finally:
        registration.setLevel(level)
        root.removeFilter(advice)
