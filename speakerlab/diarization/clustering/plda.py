"""A two-covariance PLDA fitted to an embedder's own embeddings, as VBx clustering (vbx.py) uses it:
`(N, D)` embeddings -> `(N, d)` coordinates where the within-speaker covariance is the identity and the
across-speaker covariance is `diag(phi)`, `phi` falling.

    plda = fit_plda(emb, speakers, dim=128)      # emb (N, D), speakers (N,) labels of >= 2 speakers
    plda.save("exp/plda.npz"); plda = load_plda("exp/plda.npz")
    z = plda.project(emb)                        # (N, d)

Steps (`project`): each embedding scaled to unit length, centred on the training mean, whitened by the
training set's total covariance and scaled to length sqrt(D) (length normalisation: the Gaussian model
fits the result far better than the raw embeddings); then the PLDA's own centring and the transform that
diagonalises both covariances.

The model (Ioffe 2006; the "two-covariance" form of Sizov, Lee and Kinnunen 2014): a speaker's embeddings
are x = mu + y + e, with y ~ N(0, B) shared by the speaker's embeddings and e ~ N(0, W) drawn for each.
`fit_plda` starts from the moment estimates (W: the mean within-speaker scatter, B: the covariance of the
speaker means) and runs `iterations` of EM: each speaker's posterior of y, then mu, B and W from it.
The generalised eigenvectors of (B, W) give the transform; `dim` keeps the directions of largest phi
(at most the number of training speakers - 1 carry anything).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from speakerlab.outputs import output_path

FORMAT = "speakerlab-plda-1"


class PLDAError(ValueError):
    """A PLDA file that cannot be used, or training data that cannot give one: the message names it."""


@dataclass(frozen=True)
class PLDA:
    """See the module docstring. `model_id`: the digest of the embedder it was fitted to ("" unknown)."""

    centre: np.ndarray  # (D,) mean of the unit-length training embeddings
    whiten: np.ndarray  # (D, D) total-covariance whitening
    mu: np.ndarray  # (D,) PLDA mean in the whitened, length-normalised space
    transform: np.ndarray  # (D, d) columns: generalised eigenvectors of (B, W), W-orthonormal
    phi: np.ndarray  # (d,) across-speaker variances in the projected space, falling
    model_id: str = ""
    source: str = field(default="", compare=False)  # the file it was read from (load_plda), for messages

    @property
    def where(self) -> str:
        """`FILE: ` of a PLDA read from a file, else nothing: what its messages start with."""
        return f"{self.source}: " if self.source else ""

    @property
    def dim(self) -> int:
        return len(self.phi)

    def normalise(self, emb: np.ndarray) -> np.ndarray:
        """`(N, D)` embeddings -> `(N, D)` whitened, length sqrt(D) (the space B and W live in)."""
        x = np.asarray(emb, dtype=np.float64)
        x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
        x = (x - self.centre) @ self.whiten
        return x * np.sqrt(x.shape[1]) / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)

    def project(self, emb: np.ndarray) -> np.ndarray:
        """`(N, D)` -> `(N, d)`: within-speaker covariance I, across-speaker diag(phi)."""
        if emb.shape[1] != len(self.centre):
            raise PLDAError(
                f"{self.where}the PLDA is for {len(self.centre)}-dimensional embeddings, these have {emb.shape[1]}: "
                "fit one to this model's embeddings (speakerlab-plda)"
            )
        return (self.normalise(emb) - self.mu) @ self.transform

    def save(self, path) -> None:
        with output_path(path, ".npz") as tmp:
            np.savez(
                tmp,
                format=FORMAT,
                centre=self.centre,
                whiten=self.whiten,
                mu=self.mu,
                transform=self.transform,
                phi=self.phi,
                model_id=self.model_id,
            )


def load_plda(path) -> PLDA:
    """A file `PLDA.save` wrote; anything else is a PLDAError naming the file."""
    if not Path(path).is_file():
        raise PLDAError(f"no such file: {path} (a PLDA: speakerlab-plda writes one)")
    try:
        with np.load(path, allow_pickle=False) as f:
            if "format" not in f.files or str(f["format"]) != FORMAT:
                raise PLDAError(f"{path}: not a PLDA file of speakerlab-plda (no format '{FORMAT}')")
            fields = {k: f[k] for k in ("centre", "whiten", "mu", "transform", "phi")}
            model_id = str(f["model_id"])
    except (OSError, ValueError, KeyError) as e:
        if isinstance(e, PLDAError):
            raise
        raise PLDAError(f"{path}: cannot read the PLDA: {e}") from None
    return PLDA(**{k: v.astype(np.float64) for k, v in fields.items()}, model_id=model_id, source=str(path))


def _speaker_stats(x: np.ndarray, speakers: np.ndarray):
    """`(N, D)`, `(N,)` -> counts (S,), sums (S, D) per speaker."""
    _, index = np.unique(speakers, return_inverse=True)
    counts = np.bincount(index).astype(np.float64)
    sums = np.zeros((len(counts), x.shape[1]))
    np.add.at(sums, index, x)
    return counts, sums


def _em(x: np.ndarray, counts: np.ndarray, sums: np.ndarray, iterations: int):
    """Two-covariance EM on `(N, D)` data with per-speaker `counts` (S,) and `sums` (S, D) -> (mu, B, W)."""
    n, d = x.shape
    means = sums / counts[:, None]
    mu = means.mean(axis=0)
    scatter = x.T @ x  # sum_t x_t x_t^T
    between = np.cov(means.T, bias=True) + 1e-6 * np.eye(d)
    within = (scatter - (sums.T / counts) @ sums) / n + 1e-6 * np.eye(d)
    for _ in range(iterations):
        b_inv, w_inv = np.linalg.inv(between), np.linalg.inv(within)
        # Posterior of each speaker's y + mu: precision B^-1 + n_s W^-1; one inverse per distinct count.
        post_mean = np.empty_like(means)
        second = np.zeros((d, d))  # sum_s E[(y + mu)(y + mu)^T]
        weighted = np.zeros((d, d))  # sum_s n_s E[(y + mu)(y + mu)^T]
        for c in np.unique(counts):
            group = counts == c
            cov = np.linalg.inv(b_inv + c * w_inv)
            post_mean[group] = (b_inv @ mu + sums[group] @ w_inv) @ cov
            block = group.sum() * cov + post_mean[group].T @ post_mean[group]
            second += block
            weighted += c * block
        s = len(counts)
        mu = post_mean.mean(axis=0)
        between = second / s - np.outer(mu, mu) + 1e-9 * np.eye(d)
        cross = sums.T @ post_mean  # sum_s f_s m_s^T
        within = (scatter - cross - cross.T + weighted) / n + 1e-9 * np.eye(d)
    return mu, between, within


def fit_plda(emb: np.ndarray, speakers, dim: int = 128, iterations: int = 10, model_id: str = "") -> PLDA:
    """`(N, D)` embeddings of >= 2 speakers with `speakers` (N,) labels (any hashable) -> `PLDA` keeping
    min(dim, D, speakers - 1) directions. Needs more embeddings than dimensions (the covariances)."""
    from scipy.linalg import eigh

    emb = np.asarray(emb, dtype=np.float64)
    speakers = np.asarray(speakers)
    n, d = emb.shape
    num_speakers = len(np.unique(speakers))
    if num_speakers < 2:
        raise PLDAError(f"a PLDA needs embeddings of >= 2 speakers, got {num_speakers}")
    if n <= d + num_speakers:
        raise PLDAError(f"a PLDA of {d}-dimensional embeddings needs more than {d + num_speakers} of them, got {n}")
    unit = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
    centre = unit.mean(axis=0)
    values, vectors = np.linalg.eigh(np.cov((unit - centre).T, bias=True))
    whiten = vectors / np.sqrt(np.maximum(values, 1e-10 * values.max()))
    blank = PLDA(centre, whiten, np.zeros(d), np.eye(d), np.ones(d))
    x = blank.normalise(emb)
    counts, sums = _speaker_stats(x, speakers)
    mu, between, within = _em(x, counts, sums, iterations)
    phi, transform = eigh(between, within)  # transform^T W transform = I, transform^T B transform = diag(phi)
    keep = min(dim, d, num_speakers - 1)
    order = np.argsort(-phi, kind="stable")[:keep]
    return PLDA(centre, whiten, mu, transform[:, order], np.maximum(phi[order], 0.0), model_id)
