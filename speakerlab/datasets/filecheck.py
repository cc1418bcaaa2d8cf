"""Every file of one's own recordings read once (speakerlab-folder's checks, in worker processes): the
reasons a file is left out, and the form training reads it in (the file itself, a link to it when its path
cannot be listed, or a 16-bit WAV conversion at the list's rate, first channel)."""

from __future__ import annotations

import errno
import multiprocessing
import os
from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np
import soundfile as sf

from speakerlab.dataio.audio import wav_shortfall
from speakerlab.dataio.waveform.resample import resample
from speakerlab.outputs import OutputError, is_special, output_file

KEEP_FORMATS = ("WAV", "FLAC")  # read in place by training (seekable crops); others are converted


@dataclass
class Checked:
    """What reading one file found: `problem` (None when usable), else its samples at the target rate and
    the path training reads (`use`: the file itself, its link or its conversion), with a `note`."""

    problem: Optional[str] = None
    samples: int = 0
    use: str = ""
    note: str = ""
    how: str = "as is"  # as is | converted | linked


def utf8(path: str) -> bool:
    """Whether `path` is UTF-8 (not a name of other bytes, which Python holds with surrogate escapes)."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def listable(path: str) -> bool:
    """Whether `path` can be written in a Kaldi list: UTF-8, no whitespace."""
    return utf8(path) and not any(c.isspace() for c in path)


def check_file(job: Tuple[str, str, int, float]) -> Checked:
    """(path, where a conversion or link goes without extension, sample rate, min seconds) -> Checked.

    Decodes the whole file once: a truncated file (a FLAC that loses sync, a WAV shorter than its header says)
    is left out here, not found mid-training."""
    path, dest, rate, min_seconds = job
    if not os.path.isfile(path):
        return Checked(f"left out: {not_a_file(path)}")
    if os.path.getsize(path) == 0:  # libsndfile would say "Format not recognised", which points the wrong way
        return Checked("left out: empty (0 bytes: an interrupted copy or download?)")
    name = path if utf8(path) else os.fsencode(path)  # soundfile cannot encode such a name (it is linked below)
    try:
        info = sf.info(name)
        wave, sr = sf.read(name, dtype="float32", always_2d=True)
    except Exception as e:  # soundfile raises RuntimeError / LibsndfileError subclasses
        reason = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        return Checked(f"left out: unreadable ({reason})")
    if wave.shape[0] == 0:
        return Checked("left out: empty (no samples)")
    cut = wav_shortfall(path)
    if cut is not None:
        promised = wave.shape[0] / sr * cut[0] / cut[1]
        return Checked(
            f"left out: truncated (its header promises {promised:.2f} s, the file holds {wave.shape[0] / sr:.2f} s: "
            "an interrupted copy or download?)"
        )
    if wave.shape[0] < min_seconds * sr:
        return Checked(f"left out: too short ({wave.shape[0] / sr:.2f} s < --min-seconds {min_seconds:g})")
    if not np.isfinite(wave).all():
        return Checked("left out: non-finite samples (NaN or inf)")
    if not wave.any():
        return Checked("left out: silent (every sample is 0)")
    note = f"kept: first of {wave.shape[1]} channels" if wave.shape[1] > 1 else ""
    if sr == rate and wave.shape[1] == 1 and info.format in KEEP_FORMATS:
        if listable(path):
            return Checked(samples=wave.shape[0], use=path)
        link = dest + os.path.splitext(path)[1]
        _replace_link(os.path.abspath(path), link)
        return Checked(samples=wave.shape[0], use=link, how="linked")
    try:
        out = resample(np.ascontiguousarray(wave[:, 0]), int(sr), rate)
    except ValueError as e:
        return Checked(f"left out: {e}")
    pcm = np.clip(np.round(out * 32768.0), -32768, 32767).astype(np.int16)  # the scale soundfile reads with
    with output_file(dest + ".wav", "wb", fsync=False) as f:  # a corpus of small files: checked when read
        sf.write(f, pcm, rate, subtype="PCM_16", format="WAV")
    return Checked(samples=len(pcm), use=dest + ".wav", note=note, how="converted")


def not_a_file(path: str) -> str:
    """Why `path`, which is no readable file, is not one: a broken link (to what), a link loop, a folder."""
    if os.path.islink(path):
        target = os.path.join(os.path.dirname(path), os.readlink(path))
        try:
            os.stat(path)
        except OSError as e:
            if e.errno == errno.ELOOP:
                return f"a symbolic link loop ({path} -> {os.readlink(path)} -> ...)"
            return f"a broken symbolic link: its target {os.path.normpath(target)} does not exist"
        return f"a symbolic link to {os.path.realpath(path)}, which is not a file"
    return "a folder, not a file" if os.path.isdir(path) else "does not exist"


def _replace_link(target: str, link: str) -> None:
    """A symbolic link `link` -> `target`, made beside it and renamed over it (a device or a pipe there is refused:
    speakerlab.outputs renames over regular files only)."""
    if is_special(link):
        raise OutputError(f"{link} is a device or a pipe, not a file: remove it or choose another --data folder")
    tmp = link + ".tmp"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(target, tmp)
    os.replace(tmp, link)


def _init_worker() -> None:
    try:  # each worker resamples on one thread: the pool is the parallelism
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass


def check_all(jobs: List[tuple], processes: int) -> List[Checked]:
    """check_file over `jobs`, in `processes` worker processes (results in job order)."""
    if processes <= 1 or len(jobs) < 2:
        return [check_file(j) for j in jobs]
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    with ctx.Pool(processes, initializer=_init_worker) as pool:
        return pool.map(check_file, jobs, chunksize=max(1, min(64, len(jobs) // (4 * processes))))
