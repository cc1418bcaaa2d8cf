"""Shared pieces of the corpus modules: Kaldi data-dir writing, count checks and the CLI skeleton.

Every corpus CLI (`CorpusCommand`) has the same `download` and `extract` subcommands over its own
table of `Archive`s, grouped in named parts (`vox1`, `vox2`, ...), plus its own `prepare` (and any
further step, e.g. VoxCeleb's `convert`).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Set, Tuple

from speakerlab.commands import CommandParser, run_command
from speakerlab.dataio.tables.lists import ListError, write_lists, write_table
from speakerlab.datasets.archives import install
from speakerlab.datasets.download import Archive, DownloadError, fetch_archives, locate, log, make_opener
from speakerlab.outputs import OutputError, check_folder_output, is_special, output_path

PASSWORD_ENV = "SPEAKERLAB_DOWNLOAD_PASSWORD"


class DatasetError(RuntimeError):
    """The extracted corpus is not what the prepare step expects; the message names the path."""


def require_dir(path, hint: str = "") -> Path:
    """`path` as a Path, or DatasetError naming it (with `hint`: what to run to create it)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise DatasetError(f"{path} is a file, not a folder" + (f": {hint}" if hint else ""))
    if not path.is_dir():
        raise DatasetError(f"expected folder {path} does not exist" + (f": {hint}" if hint else ""))
    return path


def require_file(path, hint: str = "") -> Path:
    path = Path(path)
    if path.is_dir():
        raise DatasetError(f"{path} is a folder, not a file" + (f": {hint}" if hint else ""))
    if not path.is_file():
        raise DatasetError(f"expected file {path} does not exist" + (f": {hint}" if hint else ""))
    return path


def check_count(what: str, have: int, published: Optional[int]) -> None:
    """Warn (not fail) when a count differs from the published corpus: subsets are legitimate."""
    if published is not None and have != published:
        log(
            f"warning: {what}: found {have}, the published corpus has {published} "
            f"(incomplete download/extraction, a different release, or a deliberate subset)"
        )


def iter_list(path, min_fields: int = 1) -> Iterator[Tuple[int, List[str]]]:
    """Non-empty lines of a corpus list file as (line number, fields), streamed (trial lists run to
    millions of lines); a line with fewer than `min_fields` fields raises naming file:line."""
    with open(require_file(path), encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) < min_fields:
                raise DatasetError(f"{path}:{lineno}: expected at least {min_fields} fields, got {line.strip()!r}")
            yield lineno, fields


def prefix_speakers(wav: Dict[str, str]) -> Dict[str, str]:
    """Utterance ids `<spk>-<rest>` -> {utterance: its speaker, the part before the first `-`}."""
    return {u: u.split("-", 1)[0] for u in wav}


def write_data_dir(root, wav: Dict[str, str], utt2spk: Optional[Dict[str, str]] = None) -> str:
    """Write `root/{wav.scp,utt2spk,spk2utt}` (sorted, absolute paths); returns a summary line.

    Expects the same utterance ids in both maps, each starting with its speaker id (so sorting
    by utterance keeps speakers together, as Kaldi tools assume); without `utt2spk`, the speaker is
    the id's part before its first `-` (`prefix_speakers`). A stale `utt2num_samples` (the index of an
    earlier run) is removed: the index stage rebuilds it.
    """
    root = Path(root)
    if utt2spk is None:
        utt2spk = prefix_speakers(wav)
    if set(wav) != set(utt2spk):
        odd = sorted(set(wav) ^ set(utt2spk))[0]
        raise DatasetError(f"{root}: utterance '{odd}' has audio but no speaker, or the reverse")
    if not wav:
        raise DatasetError(f"{root}: no utterances found")
    for utt, spk in utt2spk.items():
        if not utt.startswith(spk) or any(c.isspace() for c in utt + spk):
            raise DatasetError(
                f"{root}: utterance id '{utt}' must start with its speaker id '{spk}' and contain no whitespace"
            )
        if any(c.isspace() for c in wav[utt]):
            raise DatasetError(f"{root}: audio path of '{utt}' contains whitespace: {wav[utt]!r}")
    speakers = write_lists(root, sorted(wav), {u: os.path.abspath(w) for u, w in wav.items()}, utt2spk)
    summary = f"{root}: {len(wav)} utterances, {speakers} speakers"
    log(summary)
    return summary


_LABELS = {"1": True, "target": True, "0": False, "nontarget": False}


def parse_label(token: str, where: str) -> bool:
    """`1`/`target` -> True, `0`/`nontarget` -> False; anything else raises naming `where` (file:line)."""
    if token not in _LABELS:
        raise DatasetError(f"{where}: trial label must be 1, 0, target or nontarget, got {token!r}")
    return _LABELS[token]


def write_trials(path, rows: Iterable[Tuple[str, str, bool, int]], utts: Set[str], source) -> int:
    """Write `enrol test target|nontarget` lines, in the official order; returns how many.

    `rows` are (enrol, test, is_target, line number in `source`), streamed straight to disk. An id
    not in `utts` (the data dir's utterances) raises, after the whole list was read, naming the
    first such line of `source` and how many ids are affected; `path` is then left as it was (an earlier run's
    list stays).
    """
    path = Path(path)
    stats = {"n": 0, "target": 0, "bad": 0, "first": None}

    def lines():
        for enrol, test, target, lineno in rows:
            for u in (enrol, test):
                if u not in utts:
                    stats["bad"] += 1
                    stats["first"] = stats["first"] or (lineno, u)
            stats["n"] += 1
            stats["target"] += bool(target)
            yield enrol, (test, "target" if target else "nontarget")

    def check() -> None:
        if not stats["n"]:
            raise DatasetError(f"{source}: no trials")
        if stats["bad"]:
            lineno, u = stats["first"]
            raise DatasetError(
                f"{source}:{lineno}: '{u}' is not an utterance of {path.parent / 'wav.scp'} "
                f"({stats['bad']} trial id(s) affected; is the corpus fully extracted?)"
            )

    if is_special(path):  # a device is written through
        write_table(path, lines())
        check()
    else:  # renamed over `path` only when every id is known: a list an earlier run wrote there stays
        with output_path(path) as tmp:
            write_table(tmp, lines())
            check()
    log(f"{path}: {stats['n']} trials ({stats['target']} target)")
    return stats["n"]


def convert_trial_list(src, dst, utts: Set[str], read: Callable[[List[str], str], Tuple[str, str, str]]) -> int:
    """An official trial list `src` -> `dst` in our form (`write_trials`); returns how many trials.
    `read(fields, where)` gives a line's (enrol id, test id, label token: 1/0/target/nontarget), from its
    fields (at least 3) and `where`, its `file:line` for errors."""

    def rows():
        for lineno, f in iter_list(src, 3):
            where = f"{src}:{lineno}"
            enrol, test, label = read(f, where)
            yield enrol, test, parse_label(label, where), lineno

    return write_trials(dst, rows(), utts, src)


# ---------------------------------------------------------------- command line


def _none_if_empty(text: str) -> Optional[str]:
    return text or None


def make_parser(prog: str, doc: str, parts: Dict[str, Sequence[Archive]]):
    """Parser with the shared `download` and `extract` subcommands; returns (parser, subparsers).

    `parts` names groups of archives the user can pick with `--parts` (default: all of them).
    """
    ap = CommandParser(prog=prog, description=doc)
    sub = ap.add_subparsers(dest="step", required=True)
    for step, text in (
        ("download", "fetch the archives (or verify those in --archive-dir)"),
        ("extract", "unpack the archives into --raw-dir"),
    ):
        p = sub.add_parser(step, help=text, description=text)
        p.add_argument(
            "--parts",
            nargs="+",
            choices=sorted(parts),
            default=list(parts),
            help=f"which archives (default: all of {' '.join(parts)})",
        )
        p.add_argument("--download-dir", default="data/download", help="where archives are downloaded/joined")
        p.add_argument(
            "--archive-dir",
            type=_none_if_empty,
            default=None,
            help="folder already holding the archives (or their parts): nothing is downloaded",
        )
        if step == "download":
            p.add_argument(
                "--mirror",
                type=_none_if_empty,
                default=None,
                help="base URL replacing the official hosts: every file from <mirror>/<file name>",
            )
            p.add_argument(
                "--url",
                action="append",
                default=[],
                metavar="NAME=URL",
                help="URL of one file (repeatable), e.g. vox1_test_wav.zip=https://...",
            )
            p.add_argument("--jobs", type=int, default=4, help="files downloaded at once")
            p.add_argument("--retries", type=int, default=5, help="failed attempts in a row before a file is given up")
            p.add_argument("--skip-md5", action="store_true", help="accept files whose md5 differs")
            p.add_argument("--keep-parts", action="store_true", help="keep split-archive parts after joining")
            p.add_argument("--user", default=None, help=f"HTTP basic-auth user (password from ${PASSWORD_ENV})")
        else:
            p.add_argument("--raw-dir", default="data/raw", help="where the corpus is unpacked")
    return ap, sub


def _selected(parts: Dict[str, Sequence[Archive]], names: Sequence[str]) -> List[Archive]:
    return [a for name in names for a in parts[name]]


def download_step(args, parts: Dict[str, Sequence[Archive]], opener=None) -> None:
    """The `download` subcommand: every selected archive ends up as one verified file."""
    urls = {}
    for item in args.url:
        if "=" not in item:
            raise DownloadError(f"--url {item!r} must look like NAME=URL")
        name, url = item.split("=", 1)
        urls[name] = url
    opener = opener or make_opener(args.user, os.environ.get(PASSWORD_ENV))
    paths = fetch_archives(
        _selected(parts, args.parts),
        args.download_dir,
        archive_dir=args.archive_dir,
        mirror=args.mirror,
        urls=urls,
        check_md5=not args.skip_md5,
        keep_parts=args.keep_parts,
        jobs=args.jobs,
        opener=opener,
        retries=args.retries,
    )
    for p in paths:
        log(f"ready: {p}")


def extract_step(args, parts: Dict[str, Sequence[Archive]]) -> None:
    """The `extract` subcommand: unpack (or copy) every selected archive under --raw-dir."""
    for a in _selected(parts, args.parts):
        install(a, locate(a, args.download_dir, args.archive_dir), args.raw_dir)


class CorpusCommand:
    """The command line of one corpus: the shared `download` and `extract` subcommands over `parts`, its
    `prepare` (`prepare`) and any other step (`step`); `run(argv)` runs the chosen one: known failures
    print `error: ...` and return 2."""

    def __init__(self, prog: str, doc: str, parts: Dict[str, Sequence[Archive]]):
        self.ap, self.sub = make_parser(prog, doc, parts)
        self.parts = parts
        self.handlers: Dict[str, Callable] = {
            "download": lambda a: download_step(a, parts),
            "extract": lambda a: extract_step(a, parts),
        }
        # Each step's output folder (its option's dest): a device or a file there is refused before any work.
        self.outputs: Dict[str, str] = {"download": "download_dir", "extract": "raw_dir"}

    def prepare(
        self,
        help: str,
        handler: Callable,
        out: Tuple[str, str, str] = ("--data", "data", "output folder for the data dirs"),
        parts: bool = False,
    ) -> argparse.ArgumentParser:
        """The `prepare` subcommand calling `handler(args)`, with `--raw-dir`, the output folder `out`
        (option, default, help) and, with `parts`, `--parts`; returns its parser for the corpus's own options."""
        p = self.step("prepare", help, handler)
        p.add_argument("--raw-dir", default="data/raw", help="where the extract step unpacked the corpus")
        p.add_argument(out[0], default=out[1], help=out[2])
        self.outputs["prepare"] = out[0].lstrip("-").replace("-", "_")
        if parts:
            p.add_argument(
                "--parts",
                nargs="+",
                choices=sorted(self.parts),
                default=list(self.parts),
                help="which parts to prepare",
            )
        return p

    def step(self, name: str, help: str, handler: Callable) -> argparse.ArgumentParser:
        """A subcommand `name` calling `handler(args)`; returns its parser for its options."""
        self.handlers[name] = handler
        return self.sub.add_parser(name, help=help, description=help)

    def run(self, argv) -> int:
        args = self.ap.parse_args(argv)

        def work():
            if args.step in self.outputs:
                check_folder_output(getattr(args, self.outputs[args.step]))
            self.handlers[args.step](args)

        return run_command(work, (DatasetError, DownloadError, ListError, OutputError))
