"""Real corpora: download, extraction and Kaldi data-dir preparation, one module per corpus.

    speakerlab-voxceleb     download | extract | convert | prepare
    speakerlab-3dspeaker download | extract | prepare
    speakerlab-cnceleb      download | extract | prepare
    speakerlab-musan-rirs   download | extract | prepare
    speakerlab-folder --root DIR | --csv FILE --data OUT    (one's own recordings)

`download` fetches (or, with `--archive-dir`, only verifies) the published archives, `extract`
unpacks them under `--raw-dir`, `prepare` writes Kaldi data dirs (`wav.scp` with absolute paths,
`utt2spk`, `spk2utt`, `trials` as `enrol test target|nontarget`) under `--data`. The mechanisms
(resumable download, md5, joining split archives, safe extraction) live once, in `download.py`;
list writing and the shared command-line options live in `common.py`.
"""
