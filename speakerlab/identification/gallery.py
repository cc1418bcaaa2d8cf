"""A gallery: enrolled speakers, each with the embeddings of their enrolment files and those files' durations, and
the digest of the model that made them.

    g = read_gallery("people.npz")                 # or Gallery.empty(embedder.model_id)
    g.add("alice", ["a1.wav", "a2.wav"], emb, seconds); write_gallery("people.npz", g)
    g.summary()                                    # [(speaker, files, seconds), ...]

File: an .npz readable with numpy alone: `format` (FORMAT), `model_id`, and per enrolment file `speakers`, `utts`
(the file as given), `embeddings (M, D)` float32, `seconds (M,)`. The per-speaker statistics (count, total duration,
mean direction) come from those rows. It is written through speakerlab.outputs (a temporary file beside it, fsync,
rename): a process killed during an update leaves the gallery as it was before the update, never a torn file.

A gallery belongs to one model: embeddings of another are not comparable, so adding with, or identifying against,
another model (another digest) is a GalleryError in one line; an embedder with no digest (an int8 ONNX file, a
foreign model) cannot make or use one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import List, Sequence, Tuple

import numpy as np

from speakerlab.outputs import output_file

FORMAT = "speakerlab.gallery/1"


class GalleryError(ValueError):
    """A gallery that cannot be used as asked (another model's, another format, an unknown speaker); names the file."""


@dataclass
class Gallery:
    """Rows of enrolment files: `speakers`, `utts` (M,), `embeddings (M, D)` float32, `seconds (M,)`; `model_id`."""

    model_id: str
    speakers: np.ndarray
    utts: np.ndarray
    embeddings: np.ndarray
    seconds: np.ndarray

    @classmethod
    def empty(cls, model_id: str, dim: int) -> "Gallery":
        if not model_id:
            raise GalleryError("this model has no digest (an int8 or foreign file?): a gallery must name its model")
        return cls(model_id, np.array([], str), np.array([], str), np.zeros((0, dim), np.float32), np.zeros(0))

    def check_model(self, model_id: str, where: str) -> None:
        """A GalleryError in one line unless the gallery's embeddings are of `model_id`."""
        if model_id != self.model_id:
            raise GalleryError(
                f"{where}: a gallery of model {self.model_id[:12]}, not of this model "
                f"{model_id[:12] or '(no digest)'}: embeddings of two models are not comparable; enrol again with it"
            )

    def names(self) -> List[str]:
        """The enrolled speakers, sorted."""
        return sorted(set(self.speakers.tolist()))

    def add(self, speaker: str, utts: Sequence[str], emb: np.ndarray, seconds: Sequence[float]) -> None:
        """Enrol `utts` of `speaker` (new, or more files of an enrolled one): `emb (n, D)`, `seconds (n,)`."""
        if not speaker or any(c.isspace() for c in speaker):
            raise GalleryError(f"speaker name {speaker!r}: give a non-empty name without spaces")
        if emb.shape[1:] != self.embeddings.shape[1:]:
            raise GalleryError(f"embeddings of size {emb.shape[1]}, the gallery holds size {self.embeddings.shape[1]}")
        self.speakers = np.concatenate([self.speakers, np.array([speaker] * len(utts), str)])
        self.utts = np.concatenate([self.utts, np.asarray(list(utts), str)])
        self.embeddings = np.concatenate([self.embeddings, np.asarray(emb, np.float32)])
        self.seconds = np.concatenate([self.seconds, np.asarray(seconds, np.float64)])

    def remove(self, speaker: str, where: str) -> int:
        """Drop every row of `speaker` -> how many; an unknown speaker is a GalleryError."""
        keep = self.speakers != speaker
        if keep.all():
            raise GalleryError(f"{where}: no speaker {speaker!r} enrolled (enrolled: {', '.join(self.names())})")
        self.speakers, self.utts = self.speakers[keep], self.utts[keep]
        self.embeddings, self.seconds = self.embeddings[keep], self.seconds[keep]
        return int((~keep).sum())

    def summary(self) -> List[Tuple[str, int, float]]:
        """[(speaker, enrolment files, seconds)] sorted by speaker."""
        return [
            (s, int((self.speakers == s).sum()), float(self.seconds[self.speakers == s].sum())) for s in self.names()
        ]


def read_gallery(path) -> Gallery:
    """A gallery file -> Gallery; a GalleryError naming it when it is not one (or of another format version)."""
    path = Path(path)
    if not path.is_file():
        raise GalleryError(f"{path}: gallery file does not exist")
    try:
        with np.load(path, allow_pickle=False) as z:
            fmt = str(z["format"]) if "format" in z.files else ""
            if fmt != FORMAT:
                raise GalleryError(f"{path}: gallery format {fmt!r} is not {FORMAT!r}")
            g = Gallery(str(z["model_id"]), z["speakers"], z["utts"], z["embeddings"], z["seconds"])
    except (KeyError, ValueError, OSError, EOFError) as e:
        if isinstance(e, GalleryError):
            raise
        raise GalleryError(f"{path}: not a speakerlab gallery ({e})") from None
    n = len(g.speakers)
    if not (len(g.utts) == len(g.seconds) == len(g.embeddings) == n) or g.embeddings.ndim != 2:
        raise GalleryError(f"{path}: gallery arrays of different lengths")
    return g


def write_gallery(path, g: Gallery) -> None:
    """The whole gallery to `path`, atomically (speakerlab.outputs.output_file)."""
    with output_file(path, "wb") as f:
        np.savez(
            f,
            format=np.asarray(FORMAT),
            model_id=np.asarray(g.model_id),
            speakers=g.speakers.astype(str),
            utts=g.utts.astype(str),
            embeddings=g.embeddings.astype(np.float32),
            seconds=g.seconds.astype(np.float64),
        )
