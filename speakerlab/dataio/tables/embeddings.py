"""Embeddings files: the one reader and writer (numpy only; Kaldi ark/scp through kaldiio on request).

    write_embeddings("exp/emb/test.npz", ids, emb, kaldi=True)   # test.npz, test.ark, test.scp
    ids, emb = read_embeddings("exp/emb/test.npz")               # [str] (N,), (N, D) float32

Format: an .npz with `ids` ((N,) unicode) and `embeddings` ((N, D) float32), readable with numpy alone:
`z = np.load(OUT); dict(zip(z["ids"], z["embeddings"]))`, and `model_id` (a string) when the writer knew
which model made them (a speakerlab checkpoint's content digest; `embeddings_model_id` reads it). With
`kaldi`, `<OUT without .npz>.ark/.scp` hold the same vectors as Kaldi float vectors. Extraction,
`speakerlab-embed`, scoring (its embeddings and cohort) and calibration read and write through here;
`check_embeddings` is the one validation (ids unique, as many as rows, a 2-D float32 matrix, every value
finite), also of the in-memory embeddings that training-time validation and the baseline score. Errors
are `ListError`s naming the file (or the source given) and the first offending id.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Iterable, List, Sequence, Tuple

import numpy as np

from speakerlab.dataio.tables.lists import ListError
from speakerlab.outputs import output_file


def check_embeddings(ids: Sequence[str], emb: np.ndarray, source) -> None:
    """Raise `ListError` naming `source` unless `emb` is `(len(ids), D)` float32, finite, with unique ids."""
    if not isinstance(emb, np.ndarray) or emb.ndim != 2:
        raise ListError(f"{source}: embeddings must be a 2-D (N, D) matrix, got shape {np.shape(emb)}")
    if emb.dtype != np.float32:
        raise ListError(f"{source}: embeddings must be float32, got {emb.dtype}")
    if len(ids) != len(emb):
        raise ListError(f"{source}: {len(ids)} ids but {len(emb)} embeddings (shape {emb.shape})")
    names = np.asarray(ids)
    if len(names):
        order = np.argsort(names, kind="stable")
        repeat = np.flatnonzero(names[order][1:] == names[order][:-1])
        if repeat.size:
            first, again = sorted((int(order[repeat[0]]), int(order[repeat[0] + 1])))
            raise ListError(f"{source}: duplicate id '{names[first]}' (entries {first} and {again})")
    finite = np.isfinite(emb).all(axis=1)
    if not finite.all():  # one NaN would make every score of its trials NaN, and the metrics meaningless
        bad = np.flatnonzero(~finite)
        raise ListError(f"{source}: {len(bad)} embedding(s) are not finite, e.g. '{names[bad[0]]}'")


def read_embeddings(path) -> Tuple[List[str], np.ndarray]:
    """An embeddings .npz -> (ids (N,), `(N, D)` float32), validated by `check_embeddings`."""
    path = Path(path)
    if not path.is_file():
        raise ListError(f"{path}: embeddings file does not exist")
    try:
        with np.load(path, allow_pickle=False) as z:
            raw_ids, emb = z["ids"], np.asarray(z["embeddings"])
    except (KeyError, ValueError, OSError, EOFError) as e:
        raise ListError(f"{path}: not an embeddings .npz with 'ids' and 'embeddings' ({e})") from None
    if raw_ids.ndim != 1 or raw_ids.dtype.kind not in "US":
        raise ListError(f"{path}: 'ids' must be a 1-D array of strings, got {raw_ids.dtype} of shape {raw_ids.shape}")
    ids = raw_ids.astype(str).tolist()
    check_embeddings(ids, emb, path)
    return ids, emb


def kaldi_paths(path) -> Tuple[Path, Path]:
    """OUT.npz -> (OUT.ark, OUT.scp): where `write_embeddings(..., kaldi=True)` puts the Kaldi copy."""
    stem = Path(path).with_suffix("")
    return stem.with_name(stem.name + ".ark"), stem.with_name(stem.name + ".scp")


def embeddings_model_id(path) -> str:
    """The `model_id` an embeddings .npz records ("" when it has none or cannot be read)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            return str(z["model_id"]) if "model_id" in z.files else ""
    except (ValueError, OSError, EOFError):
        return ""


def write_embeddings(path, ids: Sequence[str], emb: np.ndarray, kaldi: bool = False, model_id: str = "") -> Path:
    """`ids (N,)`, `emb (N, D)` float32 (checked by `check_embeddings`) -> the .npz at `path`, atomically
    (a temporary file renamed); with `kaldi` also a Kaldi float-vector ark and its scp (`kaldi_paths`)."""
    path = Path(path)
    check_embeddings(ids, emb, path)
    extra = {"model_id": np.asarray(model_id)} if model_id else {}
    with output_file(path, "wb") as f:  # a device (/dev/null) is written through, never renamed over
        np.savez(f, ids=np.asarray(ids, dtype=str), embeddings=emb, **extra)
    if kaldi:
        write_kaldi_ark(*kaldi_paths(path), zip(ids, emb))
    return path


def import_kaldiio():
    """kaldiio, imported on first use: only Kaldi-format users need it (requirements.txt lists it)."""
    try:
        import kaldiio
    except ImportError:
        raise ImportError("Kaldi files need kaldiio: pip install kaldiio (see requirements.txt)") from None
    return kaldiio


def write_kaldi_ark(ark, scp, items: Iterable[Tuple[str, np.ndarray]]) -> None:
    """Each `(key, array)` of `items` (float32 `(D,)` vectors or `(T, F)` matrices) into a Kaldi binary ark at
    `ark` and its index at `scp` (`key ark:offset` lines naming `ark` as given), both through speakerlab.outputs:
    whole or not at all, a device written through (offsets are counted, so the ark need not be seekable)."""
    kaldiio, offset = import_kaldiio(), 0
    with output_file(ark, "wb") as a, output_file(scp, "w") as s:
        for key, array in items:
            entry = io.BytesIO()
            kaldiio.save_ark(entry, {key: array})
            a.write(entry.getvalue())
            s.write(f"{key} {ark}:{offset + len(key.encode()) + 1}\n")  # the data starts after `key `
            offset += len(entry.getvalue())
