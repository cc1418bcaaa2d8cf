"""A synthetic corpus re-written the way people keep their own recordings, over a telephone channel:

    speakerlab-synth --out corpus --seed 999 ...        # the voices (any speakers of any set)
    speakerlab-synth-tree --corpus corpus --out tree    # tree/<speaker>/**/<file>

Every speaker of the corpus's train, val and test sets becomes a folder of `tree` (folder names with
spaces and non-ASCII letters for some), holding its utterances in one of three layouts by speaker: flat,
one folder per call (`call1/`, `call2/`: equal file names in both), or dated folders (`2024/05/`). Every
third file is FLAC. The audio is telephone speech: band-passed to 300-3400 Hz and stored at 8 kHz, but
every seventh file at 16 kHz (the same band), and the first file of the first speaker in stereo at 44.1
kHz: a new domain for a model trained on the corpus's wide-band audio, and the mixture of rates, formats
and channel counts that real folders have. `egs/custom` fine-tunes on such a tree (tests, bench).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Dict, List

import numpy as np
import soundfile as sf

from speakerlab.commands import CommandParser, run_command
from speakerlab.dataio.waveform.resample import resample
from speakerlab.outputs import OutputError, check_folder_output, output_file
from speakerlab.synth.spectra import SR

BAND_HZ = (300.0, 3400.0)
PHONE_RATE = 8000


def telephone(wave: np.ndarray) -> np.ndarray:
    """`(N,)` at 16 kHz -> the 300-3400 Hz band of it, `(N,)` at 16 kHz (a raised-cosine edge of 100 Hz)."""
    spec = np.fft.rfft(wave)
    freqs = np.fft.rfftfreq(len(wave), 1.0 / SR)
    lo, hi = BAND_HZ
    gain = np.clip((freqs - (lo - 100)) / 100, 0, 1) * np.clip(((hi + 100) - freqs) / 100, 0, 1)
    return np.fft.irfft(spec * (0.5 - 0.5 * np.cos(np.pi * gain)), n=len(wave))


def speaker_folder(index: int, speaker: str) -> str:
    """The folder name of corpus speaker `speaker` (the index-th): some with a space, some not ASCII."""
    return {1: f"speaker {index:03d}", 2: f"Sprecher Ü{index:03d}"}.get(index % 5, speaker)


def file_path(index: int, j: int) -> str:
    """Where the j-th utterance of the index-th speaker goes, below its folder (without extension)."""
    layout = index % 3
    if layout == 0:
        return f"call{1 + j % 2}/{j // 2}"
    if layout == 1:
        return f"2024/{5 + j % 3:02d}/take {j}"
    return f"rec_{j:03d}"


def write_tree(corpus: Path, out: Path) -> Dict[str, List[Path]]:
    """Write the tree; returns {folder name: [files]}."""
    speakers: Dict[str, List[str]] = {}
    wav: Dict[str, str] = {}
    for name in ("train", "val", "test"):
        d = corpus / name
        if not (d / "utt2spk").is_file():
            continue
        wav.update(line.split(maxsplit=1) for line in (d / "wav.scp").read_text().splitlines())
        for line in (d / "utt2spk").read_text().splitlines():
            utt, spk = line.split()
            speakers.setdefault(spk, []).append(utt)
    if not speakers:
        raise SystemExit(f"error: {corpus} has no train/val/test data dirs (speakerlab-synth --out ...)")
    written: Dict[str, List[Path]] = {}
    for i, spk in enumerate(sorted(speakers)):
        folder = speaker_folder(i, spk)
        for j, utt in enumerate(sorted(speakers[spk])):
            x, sr = sf.read(wav[utt], dtype="float64")
            assert sr == SR, f"{wav[utt]}: {sr} Hz"
            band = telephone(x)
            if i == 0 and j == 0:
                wave, rate = np.stack([resample(band, SR, 44100)] * 2, axis=1) * [1.0, 0.5], 44100
            elif j % 7 == 3:
                wave, rate = band, SR
            else:
                wave, rate = resample(band, SR, PHONE_RATE), PHONE_RATE
            path = out / folder / (file_path(i, j) + (".flac" if j % 3 == 2 else ".wav"))
            path.parent.mkdir(parents=True, exist_ok=True)
            pcm = np.clip(np.round(np.asarray(wave) * 32768.0), -32768, 32767).astype(np.int16)
            with output_file(path, "wb", fsync=False) as f:
                sf.write(f, pcm, rate, subtype="PCM_16", format=path.suffix[1:].upper())
            written.setdefault(folder, []).append(path)
    return written


def main(argv=None) -> int:
    ap = CommandParser(
        prog="speakerlab-synth-tree",
        description="A synthetic corpus (speakerlab-synth) re-written as people keep their own recordings: one "
        "folder per speaker, mixed layouts, rates and formats, over a telephone channel.",
    )
    ap.add_argument("--corpus", required=True, help="output of speakerlab-synth")
    ap.add_argument("--out", required=True, help="the folder tree to write")
    args = ap.parse_args(argv)

    def work():
        written = write_tree(Path(args.corpus), check_folder_output(args.out))
        n = sum(map(len, written.values()))
        print(f"{os.path.abspath(args.out)}: {len(written)} speaker folders, {n} files", file=sys.stderr)

    return run_command(work, (OutputError,))


if __name__ == "__main__":
    sys.exit(main())
