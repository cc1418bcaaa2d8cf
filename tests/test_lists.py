import re

import pytest

from speakerlab.dataio.tables.lists import ListError, load_data_dir, read_utt2num_samples, read_wav_scp
from tests.helpers import make_data_dir


@pytest.fixture
def data(tmp_path):
    return make_data_dir(tmp_path / "d", {"a-1": "a", "a-2": "a", "b-1": "b"})


def test_valid_dir(data):
    d = load_data_dir(data)
    assert d.utts == ["a-1", "a-2", "b-1"]
    assert d.speakers == ["a", "b"] and d.spk2idx == {"a": 0, "b": 1}
    d.check_audio_exists()


def test_duplicate_id_names_file_and_line(data):
    (data / "wav.scp").write_text((data / "wav.scp").read_text() + "a-1 /x.wav\n")
    with pytest.raises(ListError, match=re.escape(f"{data / 'wav.scp'}:4: duplicate id 'a-1' (first on line 1)")):
        load_data_dir(data)


def test_utterance_without_speaker(data):
    (data / "utt2spk").write_text("a-1 a\nb-1 b\n")
    with pytest.raises(ListError, match=re.escape(f"{data / 'wav.scp'}:2: utterance 'a-2' has no speaker")):
        load_data_dir(data)


def test_speaker_for_unknown_utterance(data):
    (data / "utt2spk").write_text((data / "utt2spk").read_text() + "zz-9 z\n")
    with pytest.raises(ListError, match=re.escape(f"{data / 'utt2spk'}:4: utterance 'zz-9' is not in wav.scp")):
        load_data_dir(data)


@pytest.mark.parametrize("line", ["a-1", "a-1 a extra"])
def test_malformed_utt2spk_line(data, line):
    (data / "utt2spk").write_text(f"{line}\na-2 a\n")
    with pytest.raises(ListError, match=re.escape(f"{data / 'utt2spk'}:1: expected 2 fields")):
        load_data_dir(data)


def test_malformed_wav_scp_and_pipes(tmp_path):
    p = tmp_path / "wav.scp"
    p.write_text("u1 /a.wav\nu2\n")
    with pytest.raises(ListError, match=re.escape(f"{p}:2:")):
        read_wav_scp(p)
    p.write_text("u1 sox x.flac -t wav - |\n")
    with pytest.raises(ListError, match="pipe commands are not supported"):
        read_wav_scp(p)


def test_spk2utt_must_match(data):
    (data / "spk2utt").write_text("a a-1 b-1\nb a-2\n")
    with pytest.raises(ListError, match=re.escape(f"{data / 'spk2utt'}:1: 'b-1' under speaker 'a'")):
        load_data_dir(data)


def test_missing_audio_reports_every_file_with_line(data):
    lines = (data / "wav.scp").read_text().splitlines()
    lines[0] = "a-1 /nonexistent/one.wav"
    lines[2] = "b-1 /nonexistent/two.wav"
    (data / "wav.scp").write_text("\n".join(lines) + "\n")
    d = load_data_dir(data)
    with pytest.raises(ListError) as e:
        d.check_audio_exists()
    msg = str(e.value)
    assert msg.startswith("2 audio file(s)")
    assert f"{data / 'wav.scp'}:1: /nonexistent/one.wav" in msg
    assert f"{data / 'wav.scp'}:3: /nonexistent/two.wav" in msg


def test_utt2num_samples_validation(tmp_path):
    p = tmp_path / "utt2num_samples"
    p.write_text("u1 16000\nu2 -3\n")
    with pytest.raises(ListError, match=re.escape(f"{p}:2: sample count must be a positive integer")):
        read_utt2num_samples(p)


def test_a_length_index_older_than_the_lists_says_to_rerun_stage_2(tmp_path):
    root = make_data_dir(tmp_path / "d", {"a-0": "a", "a-1": "a"})
    (root / "utt2num_samples").write_text("a-0 8000\n")  # written before a-1 joined wav.scp
    with pytest.raises(ListError) as e:
        load_data_dir(root)
    assert str(e.value) == (
        f"{root / 'utt2num_samples'}: no entry for 'a-1' of wav.scp (the lists changed since the length index was "
        f"written); re-run the features stage (recipe stage 2: speakerlab-prepare --data {root})"
    )
