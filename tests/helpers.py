"""Small builders shared by the tests: wav files and Kaldi data dirs on disk."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Optional

import numpy as np
import soundfile as sf


def write_wav(path: Path, samples: np.ndarray, sample_rate: int = 16000, subtype: str = "PCM_16") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(path), samples, sample_rate, subtype=subtype)
    return path


def make_data_dir(
    root: Path, utts: Dict[str, str], seconds: float = 0.5, seed: int = 0, trials: Optional[str] = None
) -> Path:
    """A data dir with one random wav per utterance: `utts` maps utt -> speaker."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    scp, u2s = [], []
    for utt, spk in sorted(utts.items()):
        wav = write_wav(root / "wav" / f"{utt}.wav", 0.1 * rng.standard_normal(int(seconds * 16000)))
        scp.append(f"{utt} {wav}\n")
        u2s.append(f"{utt} {spk}\n")
    (root / "wav.scp").write_text("".join(scp))
    (root / "utt2spk").write_text("".join(u2s))
    if trials is not None:
        (root / "trials").write_text(trials)
    return root


def assert_no_traceback(*outputs: str) -> None:
    """Multi-process runs: no process may print a traceback, not even one that does not change the exit
    code (a forked loader worker's, say)."""
    for text in outputs:
        assert "Traceback" not in text, text[-3000:]
