"""Synthetic conversations from the utterances of a data dir, with their reference RTTM:
``speakerlab-synth-conversations --data data/test --out data/conv [options]``.

Each conversation draws 2-6 speakers (`--min-speakers`, `--max-speakers`) of the data dir, gives them
unequal shares of the talk, and lets them take turns until `--duration` seconds: a turn is a piece of
one of the speaker's utterances (`--turn` seconds, cut at a random place, leading and trailing silence
trimmed), the next speaker is another one, and the next turn starts after a pause (`--pause` seconds) or,
with probability `--overlap`, before the current one ends (0.2 s up to half the turn, at most 1.5 s).
Each speaker talks at their own level (RMS -26 dBFS +- 3 dB), each turn +- 1 dB on top. With `--rirs` (a folder of
room impulse responses, e.g. the corpus's RIRS_NOISES/simulated_rirs), a conversation (`--rir-prob` of them) takes
place in one room, a folder of RIRs, and each speaker in one place of it, one RIR: all their turns are convolved with
it (the direct path kept where the dry turn was; the reverberant tail runs on into what follows, and the reference
turn stays the dry speech). Background noise (`--noise`, a folder of wav files, e.g. the corpus's musan/noise; looped,
at an SNR drawn from `--snr` against the speech) is added under the whole recording.

Under OUT: wav/<id>.wav (16 kHz int16), wav.scp, rttm (the turns, speaker names of the data dir),
reco2num_spk, uem (each recording whole). A turn's reference span is the piece as placed, less its
leading and trailing frames quieter than the middle of its frame-energy range (5th to 95th percentile,
in dB): the silence the source utterance begins and ends with is not speech. Everything is drawn from
`--seed` and the conversation's index, so a rerun writes the same files.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
from scipy.signal import fftconvolve

from speakerlab.commands import CommandParser, run_command
from speakerlab.dataio.audio import AudioError, read_audio, sf
from speakerlab.dataio.tables.lists import ListError, load_data_dir
from speakerlab.dataio.tables.rttm import Turn, rttm_lines
from speakerlab.outputs import OutputError, check_folder_output, output_file, write_lines

SR = 16000
LEVEL_DB = -26.0


def trim(x: np.ndarray) -> Tuple[int, int]:
    """`(samples,)` -> the [start, end) sample span from the first to the last 25 ms frame (10 ms step)
    louder than the middle (in dB) of the 5th and 95th percentile of frame energies; (0, 0) for none."""
    frame, shift = SR // 40, SR // 100
    if len(x) < frame:
        return 0, 0
    power = np.concatenate([[0.0], np.cumsum(np.asarray(x, np.float64) ** 2)])
    starts = np.arange(1 + (len(x) - frame) // shift) * shift
    db = 10 * np.log10((power[starts + frame] - power[starts]) / frame + 1e-12)
    lo, hi = np.percentile(db, [5, 95])
    loud = np.flatnonzero(db > 0.5 * (lo + hi))
    if hi - lo < 6.0 or not loud.size:  # no contrast: silence or stationary noise
        return 0, 0
    return int(starts[loud[0]]), int(starts[loud[-1]] + frame)


def rms_db(x: np.ndarray) -> float:
    return float(10 * np.log10(np.mean(np.asarray(x, np.float64) ** 2) + 1e-12))


def parse_range(text: str, name: str) -> Tuple[float, float]:
    try:
        lo, hi = (float(v) for v in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{name} takes LOW:HIGH, got {text!r}") from None
    if not 0 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"{name} needs 0 <= LOW <= HIGH, got {text!r}")
    return lo, hi


class Source:
    """The utterances of a data dir by speaker, read on demand (16 kHz mono, as the data dir is checked for)."""

    def __init__(self, data: str):
        d = load_data_dir(data)
        self.wav = d.wav
        self.by_speaker: Dict[str, List[str]] = {}
        for utt in sorted(d.utt2spk):
            self.by_speaker.setdefault(d.utt2spk[utt], []).append(utt)

    def piece(self, utt: str, seconds: float, g: np.random.Generator) -> np.ndarray:
        """A trimmed piece of at most `seconds` of utterance `utt` (empty if it holds no speech)."""
        x = read_audio(self.wav[utt], SR)
        n = int(seconds * SR)
        if len(x) > n:
            start = int(g.integers(0, len(x) - n + 1))
            x = x[start : start + n]
        a, b = trim(x)
        return x[a:b]


class Rooms:
    """Room impulse responses (wav files under a folder) grouped by the folder holding them: a room, as RIRS_NOISES
    lays them out (simulated_rirs/<size>/RoomNNN/RoomNNN-000KK.wav, the places of one room)."""

    def __init__(self, folder: str):
        self.rooms: Dict[Path, List[Path]] = {}
        for f in sorted(Path(folder).rglob("*.wav")):
            self.rooms.setdefault(f.parent, []).append(f)
        if not self.rooms:
            raise ListError(f"--rirs {folder}: no .wav files there")
        self.names = sorted(self.rooms)

    def places(self, speakers: List[str], g: np.random.Generator) -> Dict[str, np.ndarray]:
        """{speaker: RIR (L,) float64 from its direct path on, peak 1}: one room, a place of it per speaker (distinct
        while the room has enough)."""
        room = self.rooms[self.names[int(g.integers(len(self.names)))]]
        picks = g.permutation(len(room)) if len(room) >= len(speakers) else g.integers(len(room), size=len(speakers))
        out = {}
        for spk, i in zip(speakers, picks):
            h = read_audio(str(room[int(i)]), SR).astype(np.float64)
            h = h[int(np.argmax(np.abs(h))) :]  # the direct path at 0: the turn stays where the reference has it
            out[spk] = h / (np.max(np.abs(h)) + 1e-12)
        return out


def conversation(
    source: Source, index: int, args, noises: List[Path], rooms: Optional[Rooms] = None
) -> Tuple[np.ndarray, List[Turn]]:
    """One conversation: `(samples,)` float32 and its reference turns (see the module docstring)."""
    g = np.random.default_rng([args.seed, index])
    everyone = sorted(source.by_speaker)
    k = int(g.integers(args.min_speakers, min(args.max_speakers, len(everyone)) + 1))
    speakers = [everyone[i] for i in sorted(g.choice(len(everyone), size=k, replace=False))]
    share = g.dirichlet(np.full(k, 2.0))
    level = {s: LEVEL_DB + g.uniform(-3.0, 3.0) for s in speakers}
    queue = {s: list(g.permutation(source.by_speaker[s])) for s in speakers}
    # The room from a generator of its own: without --rirs the conversations are the same as they always were.
    room_g = np.random.default_rng([args.seed, index, 1])
    places = rooms.places(speakers, room_g) if rooms and room_g.random() < args.rir_prob else {}
    lead = g.uniform(0.5, 1.5)
    placed: List[Tuple[int, np.ndarray, str, int]] = []  # start, samples (with any reverberant tail), speaker, dry
    t, last, current, misses = lead, None, int(SR * lead), 0
    while t < args.duration or len({p[2] for p in placed}) < k:
        others = [i for i in range(k) if speakers[i] != last] or [0]  # a monologue when k is 1
        p = share[others] / share[others].sum()
        spk = speakers[others[int(g.choice(len(others), p=p))]] if len(placed) >= k else speakers[len(placed)]
        if not queue[spk]:
            queue[spk] = list(g.permutation(source.by_speaker[spk]))
        utt = queue[spk].pop()
        x = source.piece(utt, g.uniform(*args.turn), g)
        if len(x) < SR // 4:
            misses += 1
            if misses > 100:
                raise ListError(f"{source.wav[utt]}: speaker '{spk}' gives no piece of speech of 0.25 s or more")
            continue
        misses = 0
        dry = len(x)
        if spk in places:
            x = fftconvolve(x, places[spk])
        x = x * 10 ** ((level[spk] + g.uniform(-1.0, 1.0) - rms_db(x[:dry])) / 20)
        if placed and g.random() < args.overlap and spk != last:  # nobody talks over themselves
            before = placed[-1][3]
            start = current - int(SR * g.uniform(0.2, max(0.2, min(1.5, 0.5 * before / SR, 0.5 * dry / SR))))
        else:
            start = current + int(SR * g.uniform(*args.pause))
        placed.append((start, x, spk, dry))
        current, last, t = max(current, start + dry), spk, max(current, start + dry) / SR
    total = current + int(SR * g.uniform(0.5, 1.5))
    speech = np.zeros(total)
    for start, x, _, _ in placed:
        speech[start : start + len(x)] += x[: total - start]  # a tail past the end is cut with the recording
    mix = speech
    if noises:
        noise = read_audio(str(noises[int(g.integers(len(noises)))]), SR).astype(np.float64)
        noise = np.roll(np.resize(noise, total), int(g.integers(total)))
        active = np.concatenate([x[:dry] for _, x, _, dry in placed])
        gain_db = rms_db(active) - g.uniform(*args.snr) - rms_db(noise)
        mix = speech + noise * 10 ** (gain_db / 20)
    peak = np.max(np.abs(mix))
    if peak > 0.99:
        mix = mix * (0.99 / peak)
    turns = sorted((Turn(s / SR, (s + dry) / SR, spk) for s, _, spk, dry in placed), key=lambda u: (u.start, u.end))
    return mix.astype(np.float32), turns


def main(argv: Optional[List[str]] = None) -> int:
    p = CommandParser(
        prog="speakerlab-synth-conversations",
        description="Synthetic conversations from a data dir's utterances, with reference RTTM.",
    )
    p.add_argument("--data", required=True, help="data dir (wav.scp, utt2spk) whose speakers talk")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--num-conversations", type=int, default=20, help="how many recordings")
    p.add_argument("--min-speakers", type=int, default=2, help="fewest speakers in a conversation")
    p.add_argument("--max-speakers", type=int, default=6, help="most speakers in a conversation")
    p.add_argument(
        "--duration", type=float, default=90.0, help="seconds of talk per conversation (the last turn ends it)"
    )
    for flag, default, text in (
        ("--turn", (1.0, 6.0), "turn length, LOW:HIGH s"),
        ("--pause", (0.2, 1.5), "pause between turns, LOW:HIGH s"),
        ("--snr", (5.0, 20.0), "speech-to-noise, LOW:HIGH dB"),
    ):
        p.add_argument(
            flag,
            type=functools.partial(parse_range, name=flag),
            default=default,
            help=f"{text} (default {default[0]:g}:{default[1]:g})",
        )
    p.add_argument("--overlap", type=float, default=0.15, help="probability that a turn starts before the last ends")
    p.add_argument("--noise", help="folder of noise wav files (searched recursively); none: no noise")
    p.add_argument("--rirs", help="folder of room impulse responses, a room per sub-folder (module doc); none: dry")
    p.add_argument("--rir-prob", type=float, default=1.0, help="with --rirs: the share of conversations in a room")
    p.add_argument(
        "--seed", type=int, default=0, help="conversation i is drawn from (seed, i): same seed, same conversations"
    )
    args = p.parse_args(argv)
    if not 1 <= args.min_speakers <= args.max_speakers:
        p.error(f"need 1 <= --min-speakers <= --max-speakers, got {args.min_speakers}, {args.max_speakers}")
    if args.num_conversations < 1:
        p.error(f"--num-conversations must be 1 or more, got {args.num_conversations}")
    if not args.duration > 0:
        p.error(f"--duration must be > 0 seconds, got {args.duration:g}")
    if not args.turn[1] > 0:
        p.error(f"--turn needs HIGH > 0 seconds, got {args.turn[0]:g}:{args.turn[1]:g}")
    if not 0 <= args.overlap <= 1:
        p.error(f"--overlap must be in [0, 1], got {args.overlap:g}")
    if not 0 <= args.rir_prob <= 1:
        p.error(f"--rir-prob must be in [0, 1], got {args.rir_prob}")
    return run_command(lambda: synthesize(args), (ListError, AudioError, OutputError))


def synthesize(args) -> None:
    """Every conversation of `args` (see `main`'s options) into `args.out`; the lists are written last."""
    source = Source(args.data)
    if len(source.by_speaker) < args.min_speakers:
        raise ListError(f"{args.data}: {len(source.by_speaker)} speaker(s), --min-speakers is {args.min_speakers}")
    noises = sorted(Path(args.noise).rglob("*.wav")) if args.noise else []
    if args.noise and not noises:
        raise ListError(f"--noise {args.noise}: no .wav files there")
    rooms = Rooms(args.rirs) if args.rirs else None
    out = check_folder_output(args.out)
    (out / "wav").mkdir(parents=True, exist_ok=True)
    scp, rttm, counts, uem = [], [], [], []
    for i in range(args.num_conversations):
        reco = f"conv{i:04d}"
        wave, turns = conversation(source, i, args, noises, rooms)
        path = out / "wav" / f"{reco}.wav"
        with output_file(path, "wb") as f:
            sf.write(f, wave, SR, subtype="PCM_16", format="WAV")
        scp.append(f"{reco} {path.resolve()}")
        rttm += rttm_lines(reco, turns)
        counts.append(f"{reco} {len({t.speaker for t in turns})}")
        uem.append(f"{reco} 1 0.000 {len(wave) / SR:.3f}")
    for name, lines in (("wav.scp", scp), ("rttm", rttm), ("reco2num_spk", counts), ("uem", uem)):
        write_lines(out / name, lines)
    hours = sum(float(line.split()[3]) for line in uem) / 3600
    print(f"speakerlab-synth-conversations: {len(scp)} conversations, {hours:.3f} h -> {out}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
