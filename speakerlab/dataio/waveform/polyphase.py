"""The polyphase resampling filter, torch-free: its design, its per-phase weights, and a numpy executor for
whole signals.

    y = polyphase(x, up, down)        # (N,) float -> (ceil(N x up / down),) float32

    y[m] = sum_n x[n] h[m * down + L - n * up],   m = 0 .. ceil(N * up / down) - 1

with h a Kaiser-windowed (beta 5) sinc low-pass of 2L + 1 taps, L = 10 x max(up, down), cut off at the lower of
the two Nyquist rates and scaled by `up`: the filter and the alignment of `scipy.signal.resample_poly`, which
the tests compare against. The outputs m = q x up + r of one phase r share one sub-filter of h, the row r of
`phase_weights`.

Two executors read these weights: `speakerlab.dataio.waveform.speed.Resampler` (a strided torch `conv1d`, batched, on
any device: speed perturbation in training, the ONNX graph) and `polyphase` here (numpy, one signal, in blocks:
whole files for inference, which must run where torch is not installed).
"""

from __future__ import annotations

from typing import Tuple

import numpy as np

KAISER_BETA = 5.0  # scipy.signal.resample_poly's default window ('kaiser', 5.0)
ZERO_CROSSINGS = 10  # half-length of the filter in units of the slower rate's period, as resample_poly
BLOCK = 1 << 15  # output groups per matrix product in `polyphase`: (BLOCK, taps) float32 stays a few MB


def lowpass_filter(up: int, down: int) -> np.ndarray:
    """The anti-aliasing filter h, (2L + 1,) float64, L = 10 * max(up, down), DC gain `up`.

    The same taps as `scipy.signal.firwin(2L + 1, 1 / max(up, down), window=('kaiser', 5.0)) * up`;
    written out (a sinc times numpy's Kaiser window) so that neither training nor inference needs scipy."""
    rate = max(up, down)
    half = ZERO_CROSSINGS * rate
    n = np.arange(-half, half + 1, dtype=np.float64)
    h = np.sinc(n / rate) * np.kaiser(2 * half + 1, KAISER_BETA)
    return h * (up / h.sum())  # unit DC gain before the zero stuffing, as firwin's scale=True


def output_length(num_samples: int, up: int, down: int) -> int:
    """ceil(num_samples * up / down): the resampled length, as resample_poly."""
    return -(-num_samples * up // down)


def phase_weights(up: int, down: int) -> Tuple[int, np.ndarray]:
    """(j_lo, W): W `(up, taps)` float64, row r the sub-filter of phase r, so that output q x up + r is
    sum_t W[r, t] x[q x down + j_lo + t] (x zero outside the signal)."""
    h = lowpass_filter(up, down)
    half = (h.shape[0] - 1) // 2
    # Phase r uses taps h[r * down + half - j * up] for input offsets j in [j_lo, j_hi].
    j_lo = -(half // up)
    j_hi = ((up - 1) * down + half) // up
    size = j_hi - j_lo + 1
    k = np.arange(up)[:, None] * down + half - (j_lo + np.arange(size))[None, :] * up
    inside = (k >= 0) & (k < h.shape[0])
    return j_lo, np.where(inside, h[np.clip(k, 0, h.shape[0] - 1)], 0.0)


def polyphase(x: np.ndarray, up: int, down: int, weights: Tuple[int, np.ndarray] = None) -> np.ndarray:
    """`(N,)` float -> `(ceil(N x up / down),)` float32: the signal resampled by up / down (module docstring).

    Float32 arithmetic, as the torch Resampler (within 1e-5 of resample_poly's float64 for full-scale
    signals); the output is computed `BLOCK` groups at a time, so memory stays O(N x up / down + taps x BLOCK).
    `weights`: `phase_weights(up, down)`, when the caller keeps them."""
    j_lo, w = weights if weights is not None else phase_weights(up, down)
    w = w.astype(np.float32)
    x = np.asarray(x, dtype=np.float32)
    n = x.shape[0]
    n_out = output_length(n, up, down)
    groups = -(-n_out // up)
    size = w.shape[1]
    left = -j_lo
    right = max(0, (groups - 1) * down + size - (n + left))
    padded = np.concatenate([np.zeros(left, np.float32), x, np.zeros(right, np.float32)])
    # Row q of the sliding view holds the inputs of output group q (a view: no copy of the signal).
    frames = np.lib.stride_tricks.sliding_window_view(padded, size)[::down]
    out = np.empty((groups, up), dtype=np.float32)
    for a in range(0, groups, BLOCK):
        b = min(groups, a + BLOCK)
        np.matmul(frames[a:b], w.T, out=out[a:b])
    return out.reshape(-1)[:n_out]
