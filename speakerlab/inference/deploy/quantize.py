"""int8 versions of a waveform ONNX file (onnxruntime.quantization), and the accuracy check that decides whether
one is written.

    graph8 = quantize_model_graph(model_graph, "static", calibration_feats)    # the model part only
    report = int8_report(fp32_path, int8_path, calibration_waves, trials)      # cosine to fp32, EERs
    problem = refusal(report, max_eer_increase=0.2, min_cosine=0.98)            # None: write it

Only the model graph (features -> embedding) is quantised; the front end (fbank or mel, whose mel matrix and log
would not survive 8 bits) stays fp32 (speakerlab.inference.deploy.graph joins the two). Quantised ops: Conv,
MatMul and Gemm, the weight-bearing ones where the time goes; pooling, attention softmaxes, SE gates and
normalisations stay float. `dynamic`: int8 weights, activations quantised per call from their own range
(ConvInteger / MatMulInteger); `static`: weights per channel and activations with ranges calibrated on the
features of the user's audio (QDQ nodes, fused by onnxruntime into QLinearConv / QLinearMatMul).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np
import onnx

MODES = ("dynamic", "static")
QUANTISED_OPS = ["Conv", "MatMul", "Gemm"]


class QuantizeError(ValueError):
    """The quantiser cannot handle this model; the message says which model and why."""


def quantize_model_graph(
    graph: onnx.ModelProto, mode: str, calibration: Sequence[np.ndarray], name: str = "model"
) -> onnx.ModelProto:
    """The model graph `feats (B, T, F)` -> `embedding (B, D)` in int8 (`mode` of MODES); `calibration`: the
    features `(1, T, F)` float32 of the calibration audio (static ranges). A failure of the quantiser is a
    QuantizeError naming `name`."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    class Feats(CalibrationDataReader):
        def __init__(self):
            self.items = iter(calibration)

        def get_next(self) -> Optional[Dict[str, np.ndarray]]:
            x = next(self.items, None)
            return None if x is None else {graph.graph.input[0].name: x}

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "fp32.onnx", Path(tmp) / "int8.onnx"
        onnx.save(graph, src)
        try:
            if mode == "dynamic":
                quantize_dynamic(src, dst, weight_type=QuantType.QInt8, op_types_to_quantize=QUANTISED_OPS)
            else:
                quantize_static(
                    src,
                    dst,
                    Feats(),
                    quant_format=QuantFormat.QDQ,
                    op_types_to_quantize=QUANTISED_OPS,
                    per_channel=True,
                    activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8,
                )
        except Exception as e:  # the quantiser's own errors are of every kind
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise QuantizeError(f"int8 {mode} of {name}: the quantiser failed: {first}") from None
        return onnx.load(dst)


def _embed(session, waves: Sequence[np.ndarray]) -> np.ndarray:
    """One wave at a time (calibration audio has every length) -> `(N, D)`."""
    out = [session.run(None, {"wave": w[None], "lengths": np.array([len(w)], np.int64)})[0][0] for w in waves]
    return np.stack(out).astype(np.float64)


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def int8_report(fp32: str, int8: str, waves: Sequence[np.ndarray], trials: Optional[tuple] = None) -> Dict[str, float]:
    """Both files on `waves` (the calibration audio): mean and least cosine of int8 to fp32 embeddings; with
    `trials` = (ids, waves, trial list path), both EERs (%) of cosine scoring on that list."""
    import onnxruntime as ort

    fp, q = (ort.InferenceSession(p, providers=["CPUExecutionProvider"]) for p in (fp32, int8))
    cos = (_unit(_embed(fp, waves)) * _unit(_embed(q, waves))).sum(axis=1)
    report = {"cosine_mean": float(cos.mean()), "cosine_min": float(cos.min()), "utterances": len(waves)}
    if trials is not None:
        from speakerlab.scoring.scorer import evaluate

        ids, test_waves, path = trials
        for key, session in (("eer_fp32", fp), ("eer_int8", q)):
            _, _, eer, _ = evaluate(list(ids), _embed(session, test_waves).astype(np.float32), str(path))
            report[key] = 100.0 * float(eer)
        report["trials"] = str(path)
    return report


def refusal(report: Dict[str, float], max_eer_increase: float, min_cosine: float) -> Optional[str]:
    """Why the int8 file must not be written (None when it may): its EER above fp32's by more than
    `max_eer_increase` points, or its mean cosine to fp32 below `min_cosine`."""
    problems: List[str] = []
    if "eer_int8" in report and report["eer_int8"] - report["eer_fp32"] > max_eer_increase:
        problems.append(
            f"EER {report['eer_int8']:.2f}% against fp32 {report['eer_fp32']:.2f}% "
            f"(+{report['eer_int8'] - report['eer_fp32']:.2f} points > {max_eer_increase:g} allowed)"
        )
    if report["cosine_mean"] < min_cosine:
        problems.append(f"mean cosine to fp32 {report['cosine_mean']:.4f} < {min_cosine:g}")
    return "; ".join(problems) or None


def describe(report: Dict[str, float]) -> str:
    """One line of the check's numbers."""
    line = (
        f"cosine to fp32 on {report['utterances']} calibration utterances: mean {report['cosine_mean']:.4f}, "
        f"min {report['cosine_min']:.4f}"
    )
    if "eer_int8" in report:
        line += f"; EER on {report['trials']}: int8 {report['eer_int8']:.2f}%, fp32 {report['eer_fp32']:.2f}%"
    return line
