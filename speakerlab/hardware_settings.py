"""The settings of the hardware a run uses: the config's `hardware` section (device, precision, batch per device,
loader workers, threads, timeouts and the speed switches), torch-free like the config that reads it; a hardware
profile (conf/hardware/) fills it (speakerlab.config.load_config). speakerlab.train.hardware applies it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from speakerlab.settings import auto_or_bool, setting

# torch.compile's modes (hardware.compile); speakerlab.train.hardware.speedups applies them.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def _compile(v) -> Optional[str]:
    if isinstance(v, bool) or v == "auto" or v in COMPILE_MODES:
        return None
    return f"must be false, true, auto or a torch.compile mode ({', '.join(COMPILE_MODES)}), got {v!r}"


def _batch(v) -> Optional[str]:
    if isinstance(v, str) and v != "auto":
        return f"must be an integer or 'auto', got {v!r}"
    if isinstance(v, int) and v < 1:
        return f"must be >= 1, got {v}"
    return None


@dataclass
class HardwareSettings:
    device: str = setting("auto", choices=("auto", "cpu", "cuda"))
    precision: str = setting("auto", choices=("auto", "bf16", "fp16", "fp32"))
    tf32: bool = True  # TF32 matmul/cuDNN on Ampere+ for the fp32 parts
    per_device_batch: Union[int, str] = setting("auto", check=_batch)  # >= 1, or auto: the largest micro batch
    # of the plan (<= max_per_device_batch) whose forward+backward fits in memory_margin x the card's free memory
    max_per_device_batch: int = setting(128, ge=1)  # auto: the largest per-card batch tried
    num_workers: int = setting(2, ge=0)
    threads: Union[int, str] = setting("auto", check=_batch)  # CPU threads of each training process (torch's
    # intra-op pool; loader workers keep 1): a number, or auto = OMP_NUM_THREADS when set, else the cores this
    # process may use (os.sched_getaffinity) / the node's processes (speakerlab.devices.resolve_threads)
    pin_memory: bool = True
    prefetch_factor: int = setting(2, ge=1)
    dist_timeout_s: int = setting(1800, ge=1)  # process-group / barrier timeout
    watchdog_s: int = setting(300, ge=5)  # multi-process: a rank not running this long ends the job
    memory_margin: float = setting(0.85, gt=0, le=1)  # auto batch: use at most this fraction of free memory
    # Speed switches (speakerlab.train.hardware.speedups); none changes results beyond float rounding.
    compile: Union[bool, str] = setting(False, check=_compile)  # torch.compile the embedding model:
    # false | true | a mode (default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs) | auto
    # (compile on CUDA, eager on CPU; a failed compile, or gradients that differ from eager's at the first batch,
    # fall back to eager, logged); either under true or a mode stops the run naming this key
    channels_last: Union[bool, str] = setting("auto", check=auto_or_bool)  # NHWC; auto: 2-D CNNs on CUDA
    cudnn_benchmark: Union[bool, str] = setting("auto", check=auto_or_bool)  # auto: on CUDA (crops have one
    # length, so cuDNN's kernel search runs once)
