"""speakerlab.dataio.tables.prepare (stage 2) as a module and a command: validate, check audio, index lengths."""

import numpy as np
import pytest

from speakerlab.dataio.tables.lists import load_data_dir
from speakerlab.dataio.tables.prepare import main, prepare
from tests.helpers import make_data_dir, write_wav


def test_prepare_writes_lengths_and_spk2utt(tmp_path):
    root = make_data_dir(
        tmp_path / "d", {"a-1": "a", "a-2": "a", "b-1": "b"}, seconds=0.25, trials="a-1 a-2 target\na-1 b-1 nontarget\n"
    )
    summary = prepare(root, jobs=2)
    assert summary == f"{root}: 3 utterances, 2 speakers, 0.00 h"
    assert (root / "utt2num_samples").read_text() == "a-1 4000\na-2 4000\nb-1 4000\n"
    assert (root / "spk2utt").read_text() == "a a-1 a-2\nb b-1\n"
    assert load_data_dir(root).num_samples == {"a-1": 4000, "a-2": 4000, "b-1": 4000}


def test_every_unusable_file_is_reported_with_its_line_and_nothing_written(tmp_path, capsys):
    root = make_data_dir(tmp_path / "d", {"a-1": "a", "a-2": "a", "b-1": "b"}, seconds=0.25)
    write_wav(root / "wav" / "a-2.wav", np.zeros(800), sample_rate=8000)
    write_wav(root / "wav" / "b-1.wav", np.zeros((800, 2)))
    assert main(["--data", str(root)]) == 2
    err = capsys.readouterr().err
    assert "2 unusable audio file(s)" in err
    assert f"{root / 'wav.scp'}:2:" in err and "sample rate 8000 Hz, expected 16000 Hz" in err
    assert f"{root / 'wav.scp'}:3:" in err and "2 channels, expected mono" in err
    assert not (root / "utt2num_samples").exists() and not (root / "spk2utt").exists()


def test_trial_with_unknown_utterance_names_the_trials_line(tmp_path, capsys):
    root = make_data_dir(
        tmp_path / "d", {"a-1": "a", "b-1": "b"}, seconds=0.25, trials="a-1 b-1 nontarget\na-1 c-9 target\n"
    )
    assert main(["--data", str(root)]) == 2
    err = capsys.readouterr().err
    assert f"{root / 'trials'}: 1 trial line(s) name ids not in {root / 'wav.scp'}" in err
    assert f"{root / 'trials'}:2: 'c-9'" in err
    assert not (root / "utt2num_samples").exists()


def test_every_trial_list_of_the_data_dir_is_checked(tmp_path, capsys):
    """The recipes' data dirs hold `trials_<name>` lists (3D-Speaker, VoxCeleb): each is checked too."""
    root = make_data_dir(tmp_path / "d", {"a-1": "a", "b-1": "b"}, seconds=0.25)
    (root / "trials_o").write_text("a-1 b-1 nontarget\n")
    (root / "trials_h").write_text("a-1 b-1 nontarget\nb-1 z-0 target\n")
    assert main(["--data", str(root)]) == 2
    err = capsys.readouterr().err
    assert f"{root / 'trials_h'}: 1 trial line(s) name ids not in {root / 'wav.scp'}" in err
    assert f"{root / 'trials_h'}:2: 'z-0'" in err
    assert not (root / "utt2num_samples").exists()


def test_an_empty_wav_scp_is_one_line_naming_it(tmp_path, capsys):
    """An empty data dir (an unlabelled dir whose wav.scp came out empty) is refused at stage 2 naming its wav.scp,
    not summarised as '0 utterances, unlabelled (no utt2spk)' (which it also said beside an empty utt2spk)."""
    for labelled in (False, True):
        root = tmp_path / f"empty{labelled}"
        root.mkdir()
        (root / "wav.scp").write_text("")
        if labelled:
            (root / "utt2spk").write_text("")
        assert main(["--data", str(root)]) == 2
        err = capsys.readouterr().err
        assert err == f"error: {root / 'wav.scp'}: no utterances in it (an empty wav.scp)\n", err
        assert sorted(p.name for p in root.iterdir()) == ["utt2spk"] * labelled + ["wav.scp"]


def test_a_rerun_after_the_lists_changed_rewrites_its_own_outputs(tmp_path, capsys):
    """spk2utt and utt2num_samples of an earlier run once refused the next one after an utterance joined the lists
    ('re-run ... speakerlab-prepare', from speakerlab-prepare): the stage rewrites what it wrote."""
    root = make_data_dir(tmp_path / "d", {"a-1": "a", "b-1": "b"}, seconds=0.25)
    assert main(["--data", str(root)]) == 0
    write_wav(root / "wav" / "a-2.wav", np.zeros(8000))
    with open(root / "wav.scp", "a") as f:
        f.write(f"a-2 {root / 'wav' / 'a-2.wav'}\n")
    with open(root / "utt2spk", "a") as f:
        f.write("a-2 a\n")
    capsys.readouterr()
    assert main(["--data", str(root)]) == 0
    err = capsys.readouterr().err
    assert f"{root / 'spk2utt'} is written again from utt2spk" in err and "utterance 'a-2' of utt2spk" in err
    assert (root / "utt2num_samples").read_text() == "a-1 4000\na-2 8000\nb-1 4000\n"
    assert (root / "spk2utt").read_text() == "a a-1 a-2\nb b-1\n"
    assert load_data_dir(root).num_samples["a-2"] == 8000
    assert main(["--data", str(root)]) == 0 and "written again" not in capsys.readouterr().err  # a third: as is


def test_jobs_below_one_is_a_usage_error(tmp_path, capsys):
    """--jobs 0 once reached the thread pool: 'ValueError: max_workers must be greater than 0', a traceback."""
    root = make_data_dir(tmp_path / "d", {"a-1": "a"}, seconds=0.25)
    with pytest.raises(SystemExit) as e:
        main(["--data", str(root), "--jobs", "0"])
    assert e.value.code == 2 and "--jobs must be >= 1, got 0" in capsys.readouterr().err
    assert not (root / "utt2num_samples").exists()
