"""The embeddings reader and writer: round trip, Kaldi copy, and every refused file named."""

import re

import numpy as np
import pytest

from speakerlab.dataio.tables.embeddings import check_embeddings, kaldi_paths, read_embeddings, write_embeddings
from speakerlab.dataio.tables.lists import ListError


def test_round_trip_and_kaldi_copy(tmp_path):
    import kaldiio  # a requirement of speakerlab (requirements.txt): never skipped

    ids = ["b", "a/x.wav", "ü"]
    emb = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    path = write_embeddings(tmp_path / "d" / "e.npz", ids, emb, kaldi=True)
    got_ids, got = read_embeddings(path)
    assert got_ids == ids and got.dtype == np.float32 and np.array_equal(got, emb)
    ark, scp = kaldi_paths(path)
    assert (ark.name, scp.name) == ("e.ark", "e.scp")
    table = kaldiio.load_scp(str(scp))
    assert list(table) == ids and all(np.array_equal(table[u], emb[i]) for i, u in enumerate(ids))
    assert sorted(p.name for p in path.parent.iterdir()) == ["e.ark", "e.npz", "e.scp"]  # no temporary left


@pytest.mark.parametrize(
    "ids, emb, message",
    [
        (["a", "b", "a"], np.zeros((3, 2), np.float32), "duplicate id 'a' (entries 0 and 2)"),
        (["a", "b"], np.zeros((3, 2), np.float32), "2 ids but 3 embeddings"),
        (["a"], np.zeros(2, np.float32), "embeddings must be a 2-D (N, D) matrix"),
        (["a", "b"], np.zeros((2, 2)), "embeddings must be float32, got float64"),
        (["a", "b"], np.array([[0, 1], [np.inf, 0]], np.float32), "1 embedding(s) are not finite, e.g. 'b'"),
    ],
)
def test_bad_embeddings_are_refused_naming_the_file(tmp_path, ids, emb, message):
    path = tmp_path / "e.npz"
    with pytest.raises(ListError, match=re.escape(f"{path}: {message}")):
        write_embeddings(path, ids, emb)
    assert not path.exists()
    np.savez(path, ids=np.array(ids), embeddings=emb)  # written by another tool: the reader refuses it too
    with pytest.raises(ListError, match=re.escape(f"{path}: {message}")):
        read_embeddings(path)


def test_unreadable_files_are_named(tmp_path):
    with pytest.raises(ListError, match="does not exist"):
        read_embeddings(tmp_path / "none.npz")
    np.savez(tmp_path / "k.npz", names=np.array(["a"]), embeddings=np.zeros((1, 2), np.float32))
    with pytest.raises(ListError, match=re.escape(f"{tmp_path / 'k.npz'}: not an embeddings .npz")):
        read_embeddings(tmp_path / "k.npz")
    (tmp_path / "t.npz").write_text("text")
    with pytest.raises(ListError, match=re.escape(f"{tmp_path / 't.npz'}: not an embeddings .npz")):
        read_embeddings(tmp_path / "t.npz")
    np.savez(tmp_path / "n.npz", ids=np.arange(2), embeddings=np.zeros((2, 2), np.float32))
    with pytest.raises(ListError, match="'ids' must be a 1-D array of strings"):
        read_embeddings(tmp_path / "n.npz")


def test_check_names_the_source():
    with pytest.raises(ListError, match=re.escape("validation: duplicate id 'u'")):
        check_embeddings(["u", "u"], np.zeros((2, 3), np.float32), "validation")
