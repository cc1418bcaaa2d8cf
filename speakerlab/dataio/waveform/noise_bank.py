"""The noise / music / babble / RIR audio of augmentation, read once into a memory-mapped int16 bank.

    speakerlab-noise-bank --lists data/musan_rirs [--out data/musan_rirs/bank] [--kinds noise ...]

`--lists` is the folder of `speakerlab-musan-rirs prepare` (`noise.scp music.scp
babble.scp rirs.scp`, `<id> <audio path>` per line). The bank folder holds:

  audio.npy   every file of every kind, end to end, int16, one flat array (read with numpy.memmap)
  index.json  per kind: ids, offsets and lengths (samples) into audio.npy, the int16 scale of each
              file, and a digest of the list it was built from (a changed list makes the bank stale)

Each file is scaled to the int16 peak before rounding (`scale` maps back to the file's floats):
every use of this audio is level-free (RIRs are normalised to unit energy, noise is set to an
SNR, babble talkers to equal level), and the full int16 range keeps the rounding noise 90 dB down.

Training processes open the bank read-only with numpy.memmap: loader workers and ranks share the
pages through the OS page cache, nothing is copied per worker and no file is re-decoded per crop.
Every unusable entry (missing, unreadable, wrong rate or channels, empty, silent, NaN/inf) is reported at
once as `list:line: ...`, and nothing is written then. Run again over lists of the same bytes (the same kinds and
rate), it builds nothing and says so.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from speakerlab.augment_settings import AUGMENT_KINDS
from speakerlab.commands import CommandParser, run_command
from speakerlab.dataio.audio import AudioError, audio_info, sf
from speakerlab.dataio.tables.lists import ListError, read_wav_scp
from speakerlab.outputs import check_folder_output, output_path, write_text

KINDS = AUGMENT_KINDS
LIST_FILES = {"reverb": "rirs.scp", "noise": "noise.scp", "music": "music.scp", "babble": "babble.scp"}
AUDIO, INDEX = "audio.npy", "index.json"
FORMAT = 1
MAX_SHOWN = 50


class BankError(ListError):
    """The bank is missing, stale or cannot be built; the message says which list / line or what to run."""


def list_digest(path: Path) -> str:
    """sha1 of a list file's bytes: a bank built from other list contents is stale."""
    return hashlib.sha1(path.read_bytes()).hexdigest()


def _check_list(kind: str, path: Path, sample_rate: int, problems: List[str]) -> List[Tuple[str, str, int, str]]:
    """(id, audio path, samples, `list:line`) of the usable entries; problems appended, not raised."""
    if not path.is_file():
        problems.append(f"{path}: list does not exist (run `speakerlab-musan-rirs prepare`)")
        return []
    try:
        entries = read_wav_scp(path)
    except ListError as e:  # malformed line or duplicate id; the message names the line
        problems.append(str(e))
        return []
    if not entries:
        problems.append(f"{path}: no entries")
    out = []
    for key, (lineno, audio) in entries.items():
        where = f"{path}:{lineno}"
        if not os.path.isfile(audio):
            problems.append(f"{where}: {audio} does not exist")
            continue
        try:
            samples = audio_info(audio, sample_rate)  # checks rate and channels; the message names the file
        except AudioError as e:
            problems.append(f"{where}: {e}")
            continue
        if samples == 0:
            problems.append(f"{where}: {audio}: empty audio file")
            continue
        out.append((key, audio, samples, where))
    return out


def _decode(audio: str, samples: int) -> np.ndarray:
    """The whole file as float64 `(samples,)`; raises AudioError naming the file."""
    try:
        wave, _ = sf.read(audio, dtype="float64", always_2d=True)
    except Exception as e:  # soundfile raises RuntimeError / LibsndfileError subclasses
        raise AudioError(f"{audio}: cannot read audio: {e}") from None
    if wave.shape[0] != samples:
        raise AudioError(f"{audio}: truncated file, decoded {wave.shape[0]} of {samples} samples")
    return wave[:, 0]


def _fill(audio: np.ndarray, checked, lists: Path, problems: List[str]) -> Tuple[Dict[str, dict], int]:
    """Each usable file of `checked` (kind -> _check_list's entries) scaled to the int16 peak into `audio` (total,),
    end to end: (the index's per-kind records, the samples written); problems appended, not raised."""
    index: Dict[str, dict] = {}
    pos = 0
    for kind, entries in checked.items():
        rec = {
            "ids": [],
            "offsets": [],
            "lengths": [],
            "scales": [],
            "list": str(lists / LIST_FILES[kind]),
            "digest": None,
        }
        for key, path, samples, where in entries:
            try:
                wave = _decode(path, samples)
            except AudioError as e:
                problems.append(f"{where}: {e}")
                continue
            if not np.isfinite(wave).all():  # would mix NaN into clean speech and blame the speech file
                problems.append(f"{where}: {path}: non-finite samples (NaN or inf)")
                continue
            peak = float(np.max(np.abs(wave)))
            if peak == 0.0:
                problems.append(f"{where}: {path}: silent audio file (all samples are zero)")
                continue
            audio[pos : pos + samples] = np.round(wave * (32767.0 / peak)).astype(np.int16)
            rec["ids"].append(key)
            rec["offsets"].append(pos)
            rec["lengths"].append(samples)
            rec["scales"].append(peak / 32767.0)
            pos += samples
        if (lists / LIST_FILES[kind]).is_file():
            rec["digest"] = list_digest(lists / LIST_FILES[kind])
        index[kind] = rec
    return index, pos


def build_bank(lists, out, kinds: Sequence[str] = KINDS, sample_rate: int = 16000, log=print) -> Path:
    """Read every file of the `kinds` lists under `lists` into `out/audio.npy` + `out/index.json`.

    Raises BankError listing every problem (with `list:line:`); the bank is then left unwritten."""
    lists, out = Path(lists), check_folder_output(out)
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown or not kinds:
        raise ValueError(f"bank kinds must be a non-empty subset of {KINDS}, got {list(kinds)}")
    if _up_to_date(out, lists, kinds, sample_rate):  # a rerun of the stage: hours of MUSAN decoded for nothing
        log(f"noise bank {out}: up to date (built from the same lists of {', '.join(kinds)}): nothing to do")
        return out
    problems: List[str] = []
    checked = {k: _check_list(k, lists / LIST_FILES[k], sample_rate, problems) for k in kinds}
    total = sum(n for entries in checked.values() for _, _, n, _ in entries)
    out.mkdir(parents=True, exist_ok=True)
    # Index first, then audio, each by an atomic rename: a reader never maps a half-written file, and a process that
    # mapped the previous audio keeps reading it (its pages stay until it is closed). The temporary audio file is
    # per builder (output_path): two builders never share a file.
    with output_path(out / AUDIO) as partial:
        audio = np.lib.format.open_memmap(partial, mode="w+", dtype=np.int16, shape=(max(total, 1),))
        index, pos = _fill(audio, checked, lists, problems)
        audio.flush()
        del audio
        if problems:
            shown = "\n".join(f"  {p}" for p in problems[:MAX_SHOWN])
            more = f"\n  ... and {len(problems) - MAX_SHOWN} more" if len(problems) > MAX_SHOWN else ""
            raise BankError(
                f"{len(problems)} problem(s) in the augmentation lists under {lists}; no bank written:\n{shown}{more}"
            )
        write_text(
            out / INDEX, json.dumps({"format": FORMAT, "sample_rate": sample_rate, "samples": pos, "kinds": index})
        )
    log(
        f"noise bank {out}: "
        + ", ".join(f"{k} {len(v['ids'])} files" for k, v in index.items())
        + f", {pos / sample_rate / 3600:.2f} h, {pos * 2 / 2**20:.1f} MiB"
    )
    return out


def _up_to_date(bank: Path, lists: Path, kinds: Sequence[str], sample_rate: int) -> bool:
    """Whether the bank at `bank` holds exactly `kinds`, built at `sample_rate` from lists of the same bytes (the
    digests its index keeps; audio files rewritten under unchanged lists are not seen)."""
    try:
        held = set(json.loads((bank / INDEX).read_text())["kinds"])
        return held == set(kinds) and bank_problem(bank, lists, kinds, sample_rate) is None
    except (OSError, ValueError, KeyError, TypeError):  # no bank, or an index of another layout: build it
        return False


def bank_problem(bank, lists, kinds: Sequence[str], sample_rate: int) -> Optional[str]:
    """Why the bank at `bank` cannot serve `kinds` of the lists under `lists` (None when it can)."""
    bank, lists = Path(bank), Path(lists)
    if not (bank / INDEX).is_file() or not (bank / AUDIO).is_file():
        return f"{bank}: no noise bank"
    meta = json.loads((bank / INDEX).read_text())
    if meta.get("format") != FORMAT or meta.get("sample_rate") != sample_rate:
        return f"{bank}: built with another format or sample rate ({meta.get('sample_rate')} Hz)"
    for kind in kinds:
        rec = meta["kinds"].get(kind)
        path = lists / LIST_FILES[kind]
        if rec is None:
            return f"{bank}: has no {kind} audio"
        if not path.is_file() or rec["digest"] != list_digest(path):
            return f"{bank}: {path} changed since the bank was built"
    return None


class NoiseBank:
    """Read-only view of a bank folder. `crop(kind, i, n, rng)` -> `(n,)` int16; `rir(i)` -> int16.

    The memmap is opened lazily in each process and dropped when pickled (DataLoader workers), so
    workers share the file's pages instead of copying the array."""

    def __init__(self, root):
        self.root = Path(root)
        if not (self.root / INDEX).is_file():  # a lists folder given for its bank, a bank not built yet
            raise BankError(
                f"{self.root}: not a noise bank (no {INDEX}); build one with `speakerlab-noise-bank --lists DIR`, "
                "which writes DIR/bank"
            )
        meta = json.loads((self.root / INDEX).read_text())
        self.sample_rate, self.samples = int(meta["sample_rate"]), int(meta["samples"])
        self.kinds = {
            k: (np.asarray(v["offsets"], dtype=np.int64), np.asarray(v["lengths"], dtype=np.int64))
            for k, v in meta["kinds"].items()
        }
        self.ids = {k: v["ids"] for k, v in meta["kinds"].items()}
        self._audio: Optional[np.ndarray] = None

    def __getstate__(self):
        return {**self.__dict__, "_audio": None}

    @property
    def audio(self) -> np.ndarray:
        if self._audio is None:
            audio = np.load(self.root / AUDIO, mmap_mode="r")
            if audio.shape != (self.samples,):  # caught between the two renames of a rebuild
                raise BankError(f"{self.root}: {AUDIO} does not match {INDEX}; rebuild with speakerlab-noise-bank")
            self._audio = audio
        return self._audio

    def count(self, kind: str) -> int:
        return len(self.kinds[kind][0]) if kind in self.kinds else 0

    def segment(self, kind: str, i: int) -> np.ndarray:
        """File `i` of `kind`, whole: `(length,)` int16, a view of the memmap."""
        offsets, lengths = self.kinds[kind]
        return self.audio[offsets[i] : offsets[i] + lengths[i]]

    def crop(self, kind: str, i: int, n: int, rng: np.random.Generator) -> np.ndarray:
        """A random `(n,)` int16 crop of file `i`, with the draws of `speakerlab.dataio.audio.read_crop`:
        a file shorter than the crop is repeated end to end from a random phase (a noise that
        stops halfway would teach the model that noise comes and goes)."""
        seg = self.segment(kind, i)
        total = seg.shape[0]
        if total >= n:
            start = int(rng.integers(0, total - n + 1))
            return np.array(seg[start : start + n])
        start = int(rng.integers(0, total))
        reps = -(-(start + n) // total)
        return np.tile(seg, reps)[start : start + n]


def main(argv=None) -> int:
    ap = CommandParser(prog="speakerlab-noise-bank", description=__doc__.split("\n")[0])
    ap.add_argument("--lists", required=True, help="folder of noise.scp music.scp babble.scp rirs.scp")
    ap.add_argument("--out", help="bank folder (default: <lists>/bank)")
    ap.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS, help="which lists to read into the bank")
    ap.add_argument("--sample-rate", type=int, default=16000, help="the rate every file must have")
    args = ap.parse_args(argv)
    out = args.out or Path(args.lists) / "bank"
    return run_command(lambda: build_bank(args.lists, out, args.kinds, args.sample_rate), (ListError, ValueError))


if __name__ == "__main__":
    sys.exit(main())
