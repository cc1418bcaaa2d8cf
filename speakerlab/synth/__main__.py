"""Write the synthetic speaker corpus: ``speakerlab-synth --out DIR [options]``.

Layout under DIR (all lists sorted, wav.scp paths absolute):
  train/ val/ test/           Kaldi data dirs: wav.scp utt2spk spk2utt (+ trials for val, test)
  wav/<set>/<spk>/<utt>.wav   16 kHz mono int16 utterances; <utt> = <spk>-<NNNN>
  musan/{noise,music,speech}/...                      MUSAN-shaped interference
  RIRS_NOISES/simulated_rirs/<size>room/RoomNNN/...   plus rir_list, like the OpenSLR 28 archive
  RIRS_NOISES/real_rirs_isotropic_noises/...          a few RIRs and isotropic noises + lists

Every file comes from its own generator seeded by (seed, kind, index...), never from worker
state, so the bytes do not depend on --jobs. A finished run leaves DIR/.synth_complete holding
its options and a fingerprint of this package's sources; a re-run with the same options and
sources does nothing, anything else regenerates the corpus from scratch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import shutil
import sys
import time
from itertools import combinations

import numpy as np

from speakerlab.commands import CommandParser
from speakerlab.dataio.audio import sf
from speakerlab.outputs import OutputError, check_folder_output, output_file, write_lines

from . import rooms
from .spectra import SR
from .voice import SpeakerTraits, draw_session, draw_speaker, synth_utterance

FORMAT_VERSION = 1
SETS = ("train", "val", "test")
OWNED = ("train", "val", "test", "wav", "musan", "RIRS_NOISES")  # what a clean re-run may delete
COMPLETE, PARTIAL = ".synth_complete", ".synth_partial"
# Generator keys: rng(seed, KEY, ...) streams never overlap between kinds of file.
KEY_SPEAKER, KEY_UTT, KEY_TRIALS, KEY_MUSAN, KEY_RIR, KEY_OTHER_SPEAKER = 1, 2, 3, 4, 5, 6
MUSAN_SECONDS = 6.0
MUSAN_COUNTS = {"noise": 8, "music": 6, "speech": 6}
ROOMS_PER_SIZE, RIRS_PER_ROOM = 2, 3


def rng(seed: int, *keys: int) -> np.random.Generator:
    """Independent generator for one (seed, kind, index...) tuple."""
    return np.random.default_rng([seed, *keys])


def speaker_traits(seed: int, index: int) -> SpeakerTraits:
    """Traits of corpus speaker ``index`` (train, then val, then test speakers are numbered on)."""
    return draw_speaker(rng(seed, KEY_SPEAKER, index))


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] synth: {msg}", file=sys.stderr, flush=True)


def _write_wav(path: str, x: np.ndarray) -> None:
    """float (N,) in [-1, 1] -> 16 kHz int16 PCM WAV; written beside and renamed, never half-done."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pcm = np.clip(np.round(np.asarray(x, dtype=np.float64) * 32767.0), -32768, 32767).astype(np.int16)
    with output_file(path, "wb", fsync=False) as f:  # thousands of small files, checked by the lists' readers
        sf.write(f, pcm, SR, subtype="PCM_16", format="WAV")


# ---------------------------------------------------------------- tasks (run in worker processes)


def _utterance_task(seed: int, spk: int, utt: int, min_dur: float, max_dur: float, path: str) -> None:
    g = rng(seed, KEY_UTT, spk, utt)
    lo, hi = int(np.ceil(min_dur * SR)), int(np.floor(max_dur * SR))
    num_samples = int(np.clip(round(g.uniform(min_dur, max_dur) * SR), lo, hi))
    _write_wav(path, synth_utterance(speaker_traits(seed, spk), num_samples, g, draw_session(g)))


def _other_speech(seed: int, index: int, num_samples: int, g: np.random.Generator) -> np.ndarray:
    """Clean speech of a speaker outside the corpus (index in a separate stream): (N,)."""
    return synth_utterance(draw_speaker(rng(seed, KEY_OTHER_SPEAKER, index)), num_samples, g)


def _musan_task(seed: int, kind: str, index: int, path: str) -> None:
    g = rng(seed, KEY_MUSAN, list(MUSAN_COUNTS).index(kind), index)
    n = int(MUSAN_SECONDS * SR)
    if kind == "noise" and index % 4 == 3:  # every fourth noise is babble of 4-7 talkers
        talkers = int(g.integers(4, 8))
        x = rooms.babble([_other_speech(seed, 1000 * index + k, n, g) for k in range(talkers)])
    elif kind == "noise":
        x = rooms.coloured_noise(n, g, slope_db=float(g.uniform(-9.0, 2.0)), eq_std_db=6.0)
    elif kind == "music":
        x = rooms.music(n, g)
    else:  # one talker reading: two utterances with a pause
        cut = int(g.uniform(0.35, 0.65) * n)
        gap = int(g.uniform(0.2, 0.6) * SR)
        x = np.concatenate(
            [
                _other_speech(seed, 1000 * index + 500, cut - gap, g),
                np.zeros(gap),
                _other_speech(seed, 1000 * index + 501, n - cut, g),
            ]
        )
    _write_wav(path, 0.1 * x / (np.sqrt(np.mean(x**2)) + 1e-12))


def _rir_task(seed: int, index: int, rt60_range: tuple, path: str) -> None:
    g = rng(seed, KEY_RIR, index)
    _write_wav(path, 0.9 * rooms.rir(g, float(g.uniform(*rt60_range))))


def _iso_noise_task(seed: int, index: int, path: str) -> None:
    g = rng(seed, KEY_RIR, 10_000 + index)
    x = rooms.coloured_noise(int(8.0 * SR), g, slope_db=float(g.uniform(-8.0, -2.0)))
    _write_wav(path, 0.05 * x)


def _code_fingerprint() -> str:
    """SHA-1 of the generator's own sources: an edited voice model never reuses an old corpus."""
    h = hashlib.sha1()
    here = os.path.dirname(os.path.abspath(__file__))
    for name in ("voice.py", "spectra.py", "rooms.py", "__main__.py"):
        with open(os.path.join(here, name), "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def _tune_malloc() -> None:
    """Keep glibc from returning every freed ~1 MB array to the kernel.

    Each utterance allocates a few such arrays; with the default dynamic thresholds glibc
    maps and unmaps them each time and the page faults cost ~40 % extra (system) time.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 128 << 20)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):  # not glibc: only slower
        pass


def _run(task: tuple) -> None:
    fn, args = task
    fn(*args)


# ---------------------------------------------------------------- corpus plan and lists


def _plan(args) -> dict:
    """{set: [(spk_id, global_index, [utt_id...])]}; speakers numbered train, val, test."""
    plan, index = {}, 0
    counts = {
        "train": (args.num_train_speakers, args.utts_per_speaker),
        "val": (args.num_val_speakers, args.eval_utts_per_speaker),
        "test": (args.num_test_speakers, args.eval_utts_per_speaker),
    }
    for name in SETS:
        n_spk, n_utt = counts[name]
        plan[name] = []
        for _ in range(n_spk):
            spk = f"spk{index:04d}"
            plan[name].append((spk, index, [f"{spk}-{u:04d}" for u in range(n_utt)]))
            index += 1
    return plan


def _trials(seed: int, set_index: int, speakers: list) -> list:
    """All target pairs within each speaker, plus twice as many random nontarget pairs."""
    target = [(a, b, "target") for _, _, utts in speakers for a, b in combinations(utts, 2)]
    utts = [(u, s) for s, _, us in speakers for u in us]
    nontarget = [(a, b) for (a, sa), (b, sb) in combinations(utts, 2) if sa != sb]
    if nontarget:
        k = min(len(nontarget), max(2 * len(target), 1))
        pick = rng(seed, KEY_TRIALS, set_index).choice(len(nontarget), size=k, replace=False)
        target += [(*nontarget[i], "nontarget") for i in sorted(pick)]
    return sorted(target)


def _write_lists(out: str, name: str, speakers: list, seed: int) -> None:
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    wav, u2s, s2u = [], [], []
    for spk, _, utts in sorted(speakers):
        s2u.append(f"{spk} {' '.join(utts)}")
        for u in utts:
            wav.append(f"{u} {os.path.join(out, 'wav', name, spk, u + '.wav')}")
            u2s.append(f"{u} {spk}")
    write_lines(os.path.join(d, "wav.scp"), sorted(wav))
    write_lines(os.path.join(d, "utt2spk"), sorted(u2s))
    write_lines(os.path.join(d, "spk2utt"), sorted(s2u))
    if name != "train":
        write_lines(os.path.join(d, "trials"), [" ".join(t) for t in _trials(seed, SETS.index(name), speakers)])


def _noise_tasks(out: str, seed: int) -> list:
    """MUSAN- and RIRS_NOISES-shaped files (tasks), and writes their list files."""
    tasks = []
    musan_dirs = {
        "noise": ("free-sound", "noise-free-sound"),
        "music": ("fma", "music-fma"),
        "speech": ("librivox", "speech-librivox"),
    }
    for kind, count in MUSAN_COUNTS.items():
        sub, stem = musan_dirs[kind]
        for i in range(count):
            tasks.append((_musan_task, (seed, kind, i, os.path.join(out, "musan", kind, sub, f"{stem}-{i:04d}.wav"))))
    sim = os.path.join(out, "RIRS_NOISES", "simulated_rirs")
    index = 0
    for size, rt60 in rooms.ROOM_RT60.items():
        lines = []
        for room in range(1, ROOMS_PER_SIZE + 1):
            for r in range(1, RIRS_PER_ROOM + 1):
                rel = f"RIRS_NOISES/simulated_rirs/{size}/Room{room:03d}/Room{room:03d}-{r:05d}.wav"
                lines.append(f"--rir-id {size}-Room{room:03d}-{r:05d} --room-id {size}-Room{room:03d} {rel}")
                tasks.append((_rir_task, (seed, index, rt60, os.path.join(out, rel))))
                index += 1
        os.makedirs(os.path.join(sim, size), exist_ok=True)
        write_lines(os.path.join(sim, size, "rir_list"), lines)
    real = "RIRS_NOISES/real_rirs_isotropic_noises"
    os.makedirs(os.path.join(out, real), exist_ok=True)
    rir_lines, noise_lines = [], []
    for i, (room, rt60) in enumerate(
        [("smallroom1", (0.2, 0.3)), ("mediumroom1", (0.4, 0.6)), ("largeroom1", (0.7, 0.9))]
    ):
        rir_id = f"RVB2014_type1_rir_{room}_near_angla"
        rir_lines.append(f"--rir-id {rir_id} --room-id RVB2014_type1_rir_{room} {real}/{rir_id}.wav")
        tasks.append((_rir_task, (seed, 5000 + i, rt60, os.path.join(out, real, rir_id + ".wav"))))
        noise_id = f"RVB2014_type1_noise_{room}_1"
        noise_lines.append(
            f"--noise-id {noise_id} --noise-type isotropic --bg-fg-type background "
            f"--room-linkage RVB2014_type1_rir_{room} {real}/{noise_id}.wav"
        )
        tasks.append((_iso_noise_task, (seed, i, os.path.join(out, real, noise_id + ".wav"))))
    write_lines(os.path.join(out, real, "rir_list"), rir_lines)
    write_lines(os.path.join(out, real, "noise_list"), noise_lines)
    return tasks


# ---------------------------------------------------------------- CLI


def parse_args(argv=None) -> argparse.Namespace:
    p = CommandParser(prog="speakerlab-synth", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="output directory (created)")
    p.add_argument(
        "--seed", type=int, default=20240607, help="each file is drawn from (seed, kind, index): same seed, same corpus"
    )
    p.add_argument("--num-train-speakers", type=int, default=400, help="speakers of train/")
    p.add_argument("--num-val-speakers", type=int, default=20, help="speakers of val/ (none of train/)")
    p.add_argument("--num-test-speakers", type=int, default=60, help="speakers of test/ (none of train/ or val/)")
    p.add_argument("--utts-per-speaker", type=int, default=12, help="per train speaker")
    p.add_argument("--eval-utts-per-speaker", type=int, default=10, help="per val / test speaker")
    p.add_argument("--min-dur", type=float, default=2.0, help="seconds, train utterances")
    p.add_argument("--max-dur", type=float, default=4.0, help="seconds, train utterances")
    # Evaluation utterances are longer than training ones, as in VoxCeleb1 (test utterances average
    # about 8 s): a 2-4 s test utterance holds a dozen phones, too few to show a voice reliably.
    p.add_argument("--eval-min-dur", type=float, default=4.0, help="seconds, val / test utterances")
    p.add_argument("--eval-max-dur", type=float, default=8.0, help="seconds, val / test utterances")
    p.add_argument("--jobs", type=int, default=1, help="worker processes (output does not depend on it)")
    p.add_argument("--force", action="store_true", help="regenerate even if a matching corpus exists")
    args = p.parse_args(argv)
    problems = []
    for lo, hi, name in ((args.min_dur, args.max_dur, ""), (args.eval_min_dur, args.eval_max_dur, "eval-")):
        if not 0.1 <= lo <= hi:
            problems.append(f"need 0.1 <= --{name}min-dur <= --{name}max-dur, got {lo}, {hi}")
    if args.num_train_speakers < 1 or args.utts_per_speaker < 1:
        problems.append("need at least one train speaker with one utterance")
    if min(args.num_val_speakers, args.num_test_speakers) < 2 or args.eval_utts_per_speaker < 2:
        problems.append("val and test need >= 2 speakers with >= 2 utterances (target and nontarget trials)")
    if args.jobs < 1:
        problems.append("--jobs must be >= 1")
    if problems:
        p.error("; ".join(problems))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        check_folder_output(args.out)
    except OutputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = os.path.abspath(args.out)
    options = {k: v for k, v in sorted(vars(args).items()) if k not in ("out", "jobs", "force")}
    options["format_version"] = FORMAT_VERSION
    options["code"] = _code_fingerprint()
    marker = os.path.join(out, COMPLETE)
    if not args.force and os.path.exists(marker):
        with open(marker) as f:
            if f.read() == json.dumps(options, sort_keys=True) + "\n":
                _log(f"{out} is already complete for these options; nothing to do")
                return 0
    # Only a directory that one of our runs started (a marker is there) is cleaned: stale files of
    # a different corpus would otherwise linger in wav/ and musan/; nothing else is ever deleted.
    if os.path.exists(marker) or os.path.exists(os.path.join(out, PARTIAL)):
        for name in OWNED:
            shutil.rmtree(os.path.join(out, name), ignore_errors=True)
        if os.path.exists(marker):
            os.remove(marker)
    os.makedirs(out, exist_ok=True)
    write_lines(os.path.join(out, PARTIAL), [json.dumps(options, sort_keys=True)])

    start = time.time()
    plan = _plan(args)
    pool = None
    if args.jobs > 1:
        methods = multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
        pool = context.Pool(args.jobs, initializer=_tune_malloc)
    else:
        _tune_malloc()
    try:
        for name in SETS:
            dur = (args.min_dur, args.max_dur) if name == "train" else (args.eval_min_dur, args.eval_max_dur)
            tasks = [
                (_utterance_task, (args.seed, gi, u, *dur, os.path.join(out, "wav", name, spk, f"{utt}.wav")))
                for spk, gi, utts in plan[name]
                for u, utt in enumerate(utts)
            ]
            t0 = time.time()
            _ = list(pool.imap_unordered(_run, tasks, chunksize=8)) if pool else [_run(t) for t in tasks]
            _write_lists(out, name, plan[name], args.seed)
            _log(
                f"{name}: {len(plan[name])} speakers, {len(tasks)} utterances -> {out}/{name} "
                f"({time.time() - t0:.1f} s)"
            )
        t0 = time.time()
        tasks = _noise_tasks(out, args.seed)
        _ = list(pool.imap_unordered(_run, tasks)) if pool else [_run(t) for t in tasks]
        _log(f"musan + RIRS_NOISES: {len(tasks)} files -> {out} ({time.time() - t0:.1f} s)")
    finally:
        if pool:
            pool.close()
            pool.join()
    write_lines(marker, [json.dumps(options, sort_keys=True)])
    os.remove(os.path.join(out, PARTIAL))
    _log(f"done in {time.time() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
