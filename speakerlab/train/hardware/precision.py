"""Numeric precision: an explicit, logged choice, never left to library defaults.

`auto` means bf16 autocast on GPUs that support it and on CPUs with bf16 instructions (x86
AVX512-BF16 or AMX: measured 1.36x faster fwd+bwd for the egs/mini CAM++ on such an EPYC; without
them bf16 is emulated and slower), else fp32 (fp16 only when asked, because it
needs loss scaling and has produced NaN losses mid-training on GPUs without bf16). TF32 for fp32
matmuls and convolutions is set from the config in every case, because PyTorch's default
(off for matmul since 1.12) silently halves fp32 speed on Ampere and newer cards.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Optional, Union

import torch


@dataclass(frozen=True)
class Precision:
    """The resolved precision of a run."""

    name: str  # bf16 | fp16 | fp32
    dtype: Optional[torch.dtype]  # autocast dtype, None for fp32
    device_type: str
    tf32: bool
    why: str = ""  # how `auto` chose, for the log

    @property
    def use_scaler(self) -> bool:
        return self.name == "fp16"

    def autocast(self):
        """Context for the model forward; features and loss stay fp32 (see AAMSoftmax)."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)

    def grad_scaler(self) -> "torch.amp.GradScaler":
        """A GradScaler that is active only for fp16 (a disabled one is a no-op pass-through)."""
        return torch.amp.GradScaler(self.device_type, enabled=self.use_scaler)

    def describe(self) -> str:
        tf32 = f", tf32 {'on' if self.tf32 else 'off'}" if self.device_type == "cuda" else ""
        why = f" ({self.why})" if self.why else ""
        return f"precision {self.name} on {self.device_type}{tf32}{why}"


def bf16_supported(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu"


def cpu_bf16_instructions(cpuinfo: str = "/proc/cpuinfo") -> Optional[str]:
    """The CPU flag that gives native bf16 arithmetic (`avx512_bf16`, `amx_bf16`), or None (also
    when the flags cannot be read, e.g. not on Linux)."""
    try:
        with open(cpuinfo) as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return None
    return next((flag for flag in ("amx_bf16", "avx512_bf16") if flag in flags), None)


def resolve_precision(requested: str, device: Union[str, torch.device], tf32: bool = True) -> Precision:
    """Turn `auto|bf16|fp16|fp32` into a Precision for `device`, and set TF32 explicitly.

    auto: bf16 on CUDA devices that support it and on CPUs with bf16 instructions, else fp32
    (emulated CPU bf16 works and can be asked for, but is slower than fp32).
    """
    dev = torch.device(device) if isinstance(device, str) else device
    dtype_name, why = requested, ""
    if requested == "auto":
        if dev.type == "cuda":
            dtype_name = "bf16" if bf16_supported(dev) else "fp32"
        else:
            flag = cpu_bf16_instructions() if dev.type == "cpu" else None
            dtype_name = "bf16" if flag else "fp32"
            why = f"auto: the CPU has {flag}" if flag else "auto: no bf16 instructions on this CPU"
    if dtype_name == "bf16" and not bf16_supported(dev):
        raise ValueError(f"hardware.precision bf16 is not supported on {dev}; use fp16 or fp32")
    if dtype_name == "fp16" and dev.type != "cuda":
        raise ValueError("hardware.precision fp16 needs a CUDA device; use bf16 or fp32 on CPU")
    if dtype_name not in ("bf16", "fp16", "fp32"):
        raise ValueError(f"hardware.precision must be auto, bf16, fp16 or fp32, got {requested!r}")
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[dtype_name]
    return Precision(dtype_name, dtype, dev.type, tf32, why)
