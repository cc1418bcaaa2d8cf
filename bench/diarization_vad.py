"""Speech detection speed on this machine: Silero's sequence ONNX model (what speakerlab.diarization.vad runs)
against its TorchScript model's frame-by-frame loop, and the energy VAD, on the same audio; and whether the
two Silero models find the same speech.

    OMP_NUM_THREADS=1 python bench/diarization_vad.py --wav-scp egs/mini_diar/data/conv/wav.scp --max-files 5

Prints one line per detector: seconds of compute per minute of audio, and the speech found (seconds).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from speakerlab.dataio.tables.lists import read_wav_scp
from speakerlab.dataio.waveform.resample import read_for_model
from speakerlab.diarization.vad import VAD_RATE, EnergyVad, SileroVad


def torchscript_silero():
    """The frame-by-frame TorchScript path of the silero-vad package (for comparison only)."""
    threads = torch.get_num_threads()
    from silero_vad import get_speech_timestamps, load_silero_vad

    torch.set_num_threads(threads)
    model = load_silero_vad()

    def detect(wave):
        stamps = get_speech_timestamps(torch.from_numpy(wave), model, sampling_rate=VAD_RATE)
        return [(s["start"] / VAD_RATE, s["end"] / VAD_RATE) for s in stamps]

    return detect


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wav-scp", required=True)
    ap.add_argument("--max-files", type=int, default=5)
    args = ap.parse_args()
    waves = [read_for_model(p, VAD_RATE) for _, p in list(read_wav_scp(args.wav_scp).values())[: args.max_files]]
    minutes = sum(len(w) for w in waves) / VAD_RATE / 60
    for name, detect in (
        ("silero sequence (onnxruntime)", SileroVad()),
        ("silero TorchScript frame loop", torchscript_silero()),
        ("energy", EnergyVad()),
    ):
        detect(waves[0][:VAD_RATE])  # load the model outside the timing
        t0 = time.perf_counter()
        found = [detect(w) for w in waves]
        spent = time.perf_counter() - t0
        speech = sum(e - s for regions in found for s, e in regions)
        print(f"{name:<32} {spent / minutes:6.2f} s per minute of audio ({minutes:.1f} min), speech {speech:.1f} s")
    print(f"torch threads {torch.get_num_threads()}, {np.__name__} {np.__version__}")


if __name__ == "__main__":
    main()
