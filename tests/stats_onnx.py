"""A small waveform ONNX file written with the onnx package for the runtime tests (tests/test_deploy.py,
tests/test_identification.py): per row, the mean and mean square of the samples, so every expected embedding is
known; and the speakerlab metadata such a file carries."""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper

from speakerlab.inference.deploy.runtime import FORMAT, META

MIN_SAMPLES = 1600  # the test file's shortest input: 0.1 s at 16 kHz


def stats_graph() -> onnx.ModelProto:
    """wave (B, N) -> (B, 2): each row's mean and mean square, as a merged exporter graph would be shaped."""
    nodes = [
        helper.make_node("ReduceMean", ["x", "axis"], ["mean"], keepdims=1),
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axis"], ["msq"], keepdims=1),
        helper.make_node("Concat", ["mean", "msq"], ["y"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "stats",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "samples"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])],
        initializer=[helper.make_tensor("axis", TensorProto.INT64, [1], [1])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def stats(wave: np.ndarray) -> np.ndarray:
    w = np.asarray(wave, np.float64)
    return np.array([w.mean(), (w * w).mean()])


def metadata(**override) -> dict:
    values = {
        "format": FORMAT,
        "model": "stats",
        "source": "tests/test_deploy.py",
        "version": "test",
        "sample_rate": "16000",
        "features": json.dumps({"kind": "none"}),
        "embedding_size": "2",
        "batching": json.dumps({"by": "samples"}),
        "min_samples": str(MIN_SAMPLES),
        **override,
    }
    return {META[k]: v for k, v in values.items() if v is not None}
