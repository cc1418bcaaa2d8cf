# The 3D-Speaker peer run of bench/deploy_speed.py (on the peer's PYTHONPATH only, never imported by speakerlab).
# This machine has no network: modelscope's snapshot_download is asked for its local cache only (its own
# local_files_only=True), and the hub check of the model id accepts an id whose snapshot is in that cache.
# infer_sv.py itself is unchanged.
import importlib

_sd = importlib.import_module(
    "modelscope.hub.snapshot_download"
)  # the module (the package's attribute is the function)
_util = importlib.import_module("modelscope.pipelines.util")

_real = _sd.snapshot_download


def _local_only(*args, **kwargs):
    kwargs["local_files_only"] = True
    return _real(*args, **kwargs)


def _cached(path, revision=None):
    try:
        _real(path, local_files_only=True)
        return True
    except Exception:
        return False


_sd.snapshot_download = _local_only
_util.is_official_hub_path = _cached
