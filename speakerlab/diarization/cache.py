"""What a recording's diarization costs most, kept for the next system that diarizes it: the VAD's speech
regions and the sub-segment embeddings, in a folder (`speakerlab-diarize --cache DIR`; the recipes use
EXP/cache, so that their five systems run the VAD and the embedder once per recording).

    cache = FrontCache("exp/diar/cache")
    entry = cache.entry("meeting.wav", "EnergyVad(...)", "model digest|name")
    entry.speech()                      # [(start, end), ...] or None
    entry.embeddings(settings, regions) # (N, D) float32 or None

An entry is keyed by the audio file (its real path, size, modification time and a digest of its first
and last 64 KiB: a rewritten file is a new entry), the VAD (its settings, `repr`) for the speech, and for
the embeddings also the model (its digest and name), the sub-segment settings (window, hop, min_embed) and
the speech regions they were cut from (oracle speech and the VAD's give different entries). Files are
written whole (speakerlab.outputs), so a killed run leaves none half-written; a file that cannot be read
is ignored and rewritten.
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
        return self._path("emb", self.model, list(settings), [[round(s, 6), round(e, 6)] for s, e in regions])

    def embeddings(self, settings: Tuple[float, ...], regions: Sequence[Interval]) -> Optional[np.ndarray]:
        try:
            with np.load(self._emb_path(settings, regions), allow_pickle=False) as f:
                return f["embeddings"]
        except (OSError, ValueError, KeyError):
            return None

    def put_embeddings(self, settings: Tuple[float, ...], regions: Sequence[Interval], emb: np.ndarray) -> None:
        with output_path(self._emb_path(settings, regions), ".npz") as tmp:
            np.savez(tmp, embeddings=np.asarray(emb, dtype=np.float32))


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
