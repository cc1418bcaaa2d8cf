"""What a recording's diarization costs most, kept for the next system that diarizes it: the VAD's speech
regions and the sub-segment embeddings, in a folder (`speakerlab-diarize --cache DIR`; the recipes use
EXP/cache, so that their five systems run the VAD and the embedder once per recording).

    cache = FrontCache("exp/diar/cache")
    entry = cache.entry("meeting.wav", "EnergyVad(...)", "model digest|name")
    entry.speech()                      # [(start, end), ...] or None
    entry.embeddings(settings, regions) # (N, D) float32 or None
    entry.local(segmenter, window, step)    # a segmentation model's (activities (W, T, K), step) or None
    entry.span_embeddings(settings, spans)  # (N, D) float32 of its local speakers' spans, or None

An entry is keyed by the audio file (its real path, size, modification time and a digest of its first
and last 64 KiB: a rewritten file is a new entry), the VAD (its settings, `repr`) for the speech, and for
the embeddings also the model (its digest and name; its weights digest where it has none: `model_key`), the
sub-segment settings (window, hop, min_embed) and the speech regions they were cut from (oracle speech and the
VAD's give different entries). A segmentation model's windows are keyed by the model (its file's digest) and the
window layout, the embeddings of its local speakers by the model, their settings and the spans they were cut from:
the three segmentation systems of a recipe share one pass of each. Files are written whole (speakerlab.outputs), so
a killed run leaves none half-written; a file that cannot be read is ignored and rewritten.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np

from speakerlab.dataio.tables.rttm import Interval
from speakerlab.outputs import output_path, write_text

SAMPLED = 1 << 16  # bytes read from each end of an audio file for its key


def digest(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]


class CacheEntry:
    """One recording's cached speech and embeddings (module docstring)."""

    def __init__(self, folder: Path, stem: str, audio_key: str, vad: str, model: str):
        self.folder, self.stem = folder, stem
        self.audio_key, self.vad, self.model = audio_key, vad, model

    def _path(self, kind: str, *key) -> Path:
        return (
            self.folder / f"{self.stem}-{kind}-{digest(self.audio_key, *key)}.{'json' if kind == 'speech' else 'npz'}"
        )

    def speech(self) -> Optional[List[Interval]]:
        try:
            return [tuple(r) for r in json.loads(self._path("speech", self.vad).read_text())["speech"]]
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put_speech(self, regions: Sequence[Interval]) -> None:
        doc = {"vad": self.vad, "speech": [[float(s), float(e)] for s, e in regions]}
        write_text(self._path("speech", self.vad), json.dumps(doc))

    def _emb_path(self, settings: Tuple[float, ...], regions: Sequence[Interval]) -> Path:
        return self._path("emb", self.model, list(settings), _rounded(regions))

    def embeddings(self, settings: Tuple[float, ...], regions: Sequence[Interval]) -> Optional[np.ndarray]:
        found = _load(self._emb_path(settings, regions), "embeddings")
        return None if found is None else found[0]

    def put_embeddings(self, settings: Tuple[float, ...], regions: Sequence[Interval], emb: np.ndarray) -> None:
        _save(self._emb_path(settings, regions), embeddings=np.asarray(emb, dtype=np.float32))

    def _local_path(self, segmenter: str, window: float, step: float) -> Path:
        return self._path("local", segmenter, float(window), float(step))

    def local(self, segmenter: str, window: float, step: float) -> Optional[Tuple[np.ndarray, int]]:
        """The segmentation model `segmenter`'s (activities (W, T, K), step in frames) of windows of `window` s
        every `step` s, or None."""
        found = _load(self._local_path(segmenter, window, step), "activities", "step")
        return None if found is None else (found[0], int(found[1]))

    def put_local(self, segmenter: str, window: float, step: float, acts: np.ndarray, frames: int) -> None:
        _save(self._local_path(segmenter, window, step), activities=np.asarray(acts, np.float32), step=int(frames))

    def _spans_path(self, settings: Tuple[float, ...], spans: Sequence[Tuple[int, int, Sequence[Interval]]]) -> Path:
        key = [[int(w), int(k), _rounded(parts)] for w, k, parts in spans]
        return self._path("spanemb", self.model, list(settings), key)

    def span_embeddings(self, settings, spans) -> Optional[np.ndarray]:
        """The embeddings (N, D) of the local speakers' `spans` [(window, speaker, [(start, end), ...]), ...] cut
        with `settings`, or None."""
        found = _load(self._spans_path(settings, spans), "embeddings")
        return None if found is None else found[0]

    def put_span_embeddings(self, settings, spans, emb: np.ndarray) -> None:
        _save(self._spans_path(settings, spans), embeddings=np.asarray(emb, dtype=np.float32))


def _rounded(intervals: Sequence[Interval]) -> list:
    """Intervals as a key: to the microsecond, so that float noise in their ends does not miss the cache."""
    return [[round(s, 6), round(e, 6)] for s, e in intervals]


def _load(path: Path, *names: str) -> Optional[tuple]:
    """The arrays `names` of the .npz at `path`, or None where it is missing or unreadable."""
    try:
        with np.load(path, allow_pickle=False) as f:
            return tuple(f[n] for n in names)
    except (OSError, ValueError, KeyError):
        return None


def _save(path: Path, **arrays) -> None:
    with output_path(path, ".npz") as tmp:
        np.savez(tmp, **arrays)


class FrontCache:
    """A folder of `CacheEntry` files (module docstring)."""

    def __init__(self, folder):
        self.folder = Path(folder)

    def entry(self, path: str, vad: str, model: str) -> CacheEntry:
        """The entry of audio file `path` with the VAD described by `vad` and the model `model`."""
        real = os.path.realpath(path)
        st = os.stat(real)
        with open(real, "rb") as f:  # its first and last 64 KiB: a file rewritten within the clock's tick differs
            head = f.read(SAMPLED)
            f.seek(max(0, st.st_size - SAMPLED))
            sampled = hashlib.sha256(head + f.read(SAMPLED)).hexdigest()
        stem = "".join(c if c.isalnum() or c in "-_" else "_" for c in Path(path).stem)[:40]
        return CacheEntry(self.folder, stem, digest(real, st.st_size, st.st_mtime_ns, sampled), vad, model)
