"""VoxBlink2 (16 kHz wav, 111,284 speakers, 9,904,382 utterances) as a Kaldi data dir.

    speakerlab-voxblink2 download --archive-dir A [--download-dir D]    # verify / join the archive you were sent
    speakerlab-voxblink2 extract  [--raw-dir R]
    speakerlab-voxblink2 prepare  [--raw-dir R] [--data DATA] [--audio-dir DIR]

The corpus (Lin et al., "VoxBlink2: A 100K+ speaker recognition corpus and the open-set speaker-identification
benchmark", Interspeech 2024) is published as annotations only (github.com/VoxBlink2/ScriptsForVoxBlink2: YouTube
ids and time stamps, `meta/<spk>/<video>/<n>.txt`); its authors send the audio on request (the form linked from
that repository's issues #9 and #10) as VB2_audio.tar.gz split into parts VB2_audio.tar.gz.00, .01, ... (40,
.00 to .39, in the copies users describe in its issue #15), joined and unpacked here. Nothing here downloads it:
put what you received in --archive-dir (the 40 parts, or, for another number of parts, the joined
VB2_audio.tar.gz: `cat VB2_audio.tar.gz.* > VB2_audio.tar.gz`). No md5 is published, so none is checked.

Layout under R once extracted (what the authors' cropper_audio.py writes, and what ReDimNet2's vb2_vox2_cnc2
recipe reads):
  voxblink2/audio/<spk>/<video>/<n>.wav    e.g. audio/id000000/DwgYRqnQZHM/00000.wav (speaker id000000 ..
                                           id111283, 11-character YouTube ids, utterances numbered per video)
`--audio-dir` points at another folder of that `<spk>/<video>/<n>.wav` tree (audio you cropped yourself with
cropper_audio.py, say).

Data dir under DATA: `vb2`, utterance id `<spk>-<video>-<n>` (id000000-DwgYRqnQZHM-00000), the speaker the part
before the first `-` (YouTube ids may hold `-`; speaker ids do not). Every speaker is a training speaker: the
VoxBlink2 evaluation protocols are not used here (recipes evaluate on VoxCeleb1 and CN-Celeb).
"""

from __future__ import annotations

import sys
from pathlib import Path

from speakerlab.datasets.common import (
    CorpusCommand,
    DatasetError,
    check_count,
    prefix_speakers,
    require_dir,
    write_data_dir,
)
from speakerlab.datasets.download import Archive, Part
from speakerlab.datasets.voxceleb import scan

PARTS = {
    "audio": (
        Archive(
            "VB2_audio.tar.gz",
            None,
            "",  # no public host: the archive is sent on request
            parts=tuple(Part(f"VB2_audio.tar.gz.{i:02d}") for i in range(40)),
            dest="voxblink2",
        ),
    ),
}
PUBLISHED = {"speakers": 111284, "utterances": 9904382}
REQUEST = (
    "VoxBlink2's audio is sent by its authors on request (see github.com/VoxBlink2/ScriptsForVoxBlink2, issues #9 "
    "and #10): put VB2_audio.tar.gz or its parts VB2_audio.tar.gz.NN in a folder and pass --archive-dir FOLDER "
    "(or --mirror / --url where you host them)"
)


def prepare(raw_dir, data, audio_dir=None) -> None:
    """DATA/vb2 from the `<spk>/<video>/<n>.wav` tree (module doc); a missing tree raises naming it."""
    root = Path(audio_dir) if audio_dir else Path(raw_dir) / "voxblink2" / "audio"
    wav = scan(require_dir(root, "run `speakerlab-voxblink2 extract` (or give --audio-dir)"))
    if not wav:
        raise DatasetError(f"{root}: no <spk>/<video>/<n>.wav files")
    check_count("vb2 speakers", len(set(prefix_speakers(wav).values())), PUBLISHED["speakers"])
    check_count("vb2 utterances", len(wav), PUBLISHED["utterances"])
    write_data_dir(Path(data) / "vb2", wav)


def main(argv=None) -> int:
    cli = CorpusCommand("speakerlab-voxblink2", __doc__, PARTS)
    download = cli.handlers["download"]

    def download_given(args):
        if args.archive_dir is None and args.mirror is None and not args.url:
            raise DatasetError(REQUEST)
        download(args)

    cli.handlers["download"] = download_given
    p = cli.prepare("write the Kaldi data dir", lambda a: prepare(a.raw_dir, a.data, a.audio_dir))
    p.add_argument("--audio-dir", default=None, help="the <spk>/<video>/<n>.wav tree (default <raw>/voxblink2/audio)")
    return cli.run(argv)


if __name__ == "__main__":
    sys.exit(main())
