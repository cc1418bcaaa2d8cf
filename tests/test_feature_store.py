"""Offline feature store: contents, option checks, its index of feats.scp (arrays, not a dict), extraction and
training from it."""

import tracemalloc

import kaldiio
import numpy as np
import pytest
import torch

from speakerlab.config import ConfigError, load_config
from speakerlab.dataio.audio import read_audio
from speakerlab.dataio.tables.columns import FixedView
from speakerlab.dataio.tables.lists import ListError, read_table
from speakerlab.features.fbank import Fbank, num_frames
from speakerlab.features.store import FEATS_SCP, FeatureCropDataset, FeatureStore, collate_feats, main
from speakerlab.frontends import FbankConfig, FeatureSpec
from speakerlab.inference.embedder import Embedder
from speakerlab.inference.extract import embed_data_dir
from speakerlab.models import build_model
from speakerlab.train.inputs.loader import JoinedStore
from speakerlab.train.loop import main as train_main
from tests.helpers import losses, make_data_dir, tiny_config, write_wav


@pytest.fixture
def data(tmp_path):
    root = make_data_dir(tmp_path / "d", {"a-0": "a", "a-1": "a", "b-0": "b"}, seconds=0.5)
    return root


def test_store_holds_the_fbank_of_every_utterance(data):
    assert main(["--data", str(data)]) == 0
    store = FeatureStore(data, FbankConfig())
    fbank = Fbank()
    for utt in ("a-0", "a-1", "b-0"):
        wave = read_audio(str(data / "wav" / f"{utt}.wav"))
        expected = fbank(torch.from_numpy(wave).unsqueeze(0))[0].numpy()
        np.testing.assert_array_equal(store[utt], expected)
    # Plain Kaldi format: any Kaldi reader gets the same matrices.
    assert sorted(kaldiio.load_scp(str(data / FEATS_SCP))) == ["a-0", "a-1", "b-0"]
    with pytest.raises(ListError, match="'nope' is not in the feature store"):
        store["nope"]


def test_store_with_other_options_names_the_option(data, tmp_path):
    with pytest.raises(ListError, match="no complete feature store; run speakerlab-feature-store"):
        FeatureStore(data)
    assert main(["--data", str(data)]) == 0
    with pytest.raises(ValueError, match="num_mel_bins=80, the config asks for num_mel_bins=64"):
        FeatureStore(data, FbankConfig(num_mel_bins=64))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"model: {{name: campplus}}\ndata: {{train: {data}}}\nfeatures: {{num_mel_bins: 64}}\n")
    assert main(["--data", str(data), "--config", str(cfg)]) == 0
    assert FeatureStore(data, FbankConfig(num_mel_bins=64))["a-0"].shape[1] == 64


def test_a_store_read_from_another_folder_reads_its_own_ark_never_one_of_the_same_name(data, tmp_path, monkeypatch):
    """Relative ark paths are from the folder the store was made in (as Kaldi's). Read from another folder that has
    an ark of the same relative name (every recipe's store is data/<set>/feats.ark), the store reads its own, found
    from feats.json's `written_from`, not those bytes; where its own is gone, or the store is older than
    `written_from` and the ark there is another's, it says so when opened, not a loader worker mid-run."""
    import json

    monkeypatch.chdir(data.parent)
    assert main(["--data", data.name]) == 0
    own = {utt: FeatureStore(data.name)[utt] for utt in ("a-0", "b-0")}
    elsewhere = tmp_path / "elsewhere"
    make_data_dir(elsewhere / "d", {"a-0": "a", "a-1": "a", "b-0": "b"}, seconds=0.7, seed=1)
    monkeypatch.chdir(elsewhere)
    assert main(["--data", "d"]) == 0  # elsewhere/d/feats.ark: the same relative name, other features
    store = FeatureStore(data)
    for utt, feats in own.items():
        np.testing.assert_array_equal(store[utt], feats)
    conf = data / "feats.json"
    meta = json.loads(conf.read_text())
    conf.write_text(json.dumps({k: v for k, v in meta.items() if k not in ("written_from", "ark_bytes")}))
    with pytest.raises(ListError, match=r"feats.scp: 'b-0' is in d/feats.ark: d/feats.ark holds another store's"):
        FeatureStore(data)  # a store of before `written_from`: only the folder it runs in, and that ark is another's
    conf.write_text(json.dumps(meta))
    (data / "feats.ark").rename(data / "moved.ark")
    (elsewhere / "d" / "feats.ark").unlink()
    with pytest.raises(ListError, match=r"'a-0' is in d/feats.ark: no such file from .*elsewhere or .*run from"):
        FeatureStore(data)


def test_frame_crops_follow_the_seed_and_repeat_short_utterances(data):
    main(["--data", str(data)])
    store = FeatureStore(data)
    crop = 16000  # 1 s: longer than the 0.5 s utterances, so they are repeated
    ds = FeatureCropDataset(store, ["a-0", "b-0"], ["x", "y"], [0, 1], crop, FbankConfig())
    a, b = ds[(1, 5)], ds[(1, 5)]
    assert a["feats"].shape == (num_frames(crop, FbankConfig()), 80) and a["label"] == 1 and a["finite"]
    assert np.array_equal(a["feats"], b["feats"])
    full = store["b-0"]
    start = int(np.random.default_rng(5).integers(0, full.shape[0]))
    assert np.array_equal(a["feats"], np.tile(full, (3, 1))[start : start + a["feats"].shape[0]])
    batch = collate_feats([a, ds[(0, 6)]])
    assert batch["feats"].shape == (2, 98, 80) and batch["label"].tolist() == [1, 0]


def test_extraction_from_the_store_equals_extraction_from_audio(data):
    main(["--data", str(data)])
    model = build_model(
        "campplus", embedding_size=32, growth_rate=8, bn_size=2, init_channels=16, m_channels=8, num_layers=[1, 1, 1]
    ).eval()
    embedder = Embedder(model, FeatureSpec(FbankConfig()), "cpu")
    ids, from_audio = embed_data_dir(embedder, data)
    store_ids, from_store = embed_data_dir(embedder, data, store=FeatureStore(data, FbankConfig()))
    assert store_ids == ids and len(FeatureStore(data).entries) == len(ids)
    np.testing.assert_allclose(from_store, from_audio, rtol=1e-5, atol=1e-6)


def test_training_from_the_store(tmp_path):
    cfg, train = tiny_config(tmp_path, val=False)
    assert main(["--data", str(train)]) == 0
    assert (
        train_main(["--config", str(cfg), "--exp-dir", str(tmp_path / "f"), "train.epochs=1", "data.feats=true"]) == 0
    )
    assert sorted(losses(tmp_path / "f")) == [1, 2] and all(np.isfinite(v) for v in losses(tmp_path / "f").values())
    with pytest.raises(ConfigError, match="config key 'data.feats': stored features cannot be augmented"):
        load_config(cfg, ["data.feats=true", "augment.speed_prob=0.5"])


def test_rerun_keeps_an_up_to_date_store_and_rebuilds_a_stale_one(data, tmp_path, capsys):
    other = make_data_dir(tmp_path / "o", {"c-0": "c"}, seconds=0.4, seed=3)
    assert main(["--data", str(data), "--data", str(other)]) == 0  # one process, several data dirs
    ark = data / "feats.ark"
    first = ark.stat().st_mtime_ns
    assert main(["--data", str(data)]) == 0
    assert "up to date (3 utterances)" in capsys.readouterr().out and ark.stat().st_mtime_ns == first
    (data / "wav.scp").write_text((data / "wav.scp").read_text())  # the list changed after the store
    assert main(["--data", str(data)]) == 0
    assert ark.stat().st_mtime_ns != first and FeatureStore(data)["a-1"].shape[1] == 80


def test_a_file_shorter_than_one_frame_is_named_with_its_wav_scp_line(tmp_path, capsys):
    """speakerlab-prepare takes a file of a few samples (a cut-short copy); the store's fbank then stopped with
    'wave of 28 samples is too short for one frame', naming no file among thousands."""
    data = make_data_dir(tmp_path / "d", {"a-0": "a", "b-0": "b"}, seconds=0.5)
    write_wav(data / "wav" / "b-0.wav", np.zeros(28))
    assert main(["--data", str(data)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {data / 'wav.scp'}:2: {data / 'wav' / 'b-0.wav'}: wave of 28 samples is too short")
    assert err.count("\n") == 1 and not (data / "feats.json").exists()


def test_validation_reads_the_store_of_the_val_dir(tmp_path, monkeypatch):
    from speakerlab.train.state import validation

    cfg, _ = tiny_config(tmp_path, val=True)
    val = tmp_path / "val"
    model = build_model("campplus", embedding_size=16, growth_rate=8, init_channels=16, m_channels=4)
    spec = FeatureSpec(FbankConfig(), mean_norm=True)
    from_audio = validation.validation_eer(model, spec, str(val), torch.device("cpu"))
    assert main(["--data", str(val)]) == 0
    from speakerlab.inference import units

    monkeypatch.setattr(units, "AudioUnits", None)  # no audio may be read when the store fits
    assert validation.validation_eer(model, spec, str(val), torch.device("cpu")) == pytest.approx(from_audio)


def test_a_store_of_lists_since_rewritten_says_to_rerun_stage_2(tmp_path, capsys):
    """The data preparation stage re-run on a changed folder (stage 1) rewrites the lists; a store of the old
    ones (stage 2 not re-run) stops training at start with the stage and the command that rebuild it, not a
    count of utterances missing from the store."""
    cfg, train = tiny_config(tmp_path, val=False)
    assert main(["--data", str(train)]) == 0
    make_data_dir(train, {f"s{s}-{u}": f"s{s}" for s in range(5) for u in range(4)}, seconds=0.6, seed=7)
    exp = tmp_path / "f"
    assert train_main(["--config", str(cfg), "--exp-dir", str(exp), "data.feats=true"]) == 2
    err = capsys.readouterr().err
    assert (
        f"error: {train / FEATS_SCP}: the feature store was computed from another wav.scp (4 utterance(s) of wav.scp "
        "not in it, 0 no longer listed: the data preparation stage ran again since); re-run the features stage "
        f"(recipe stage 2: speakerlab-feature-store --data {train})"
    ) in err
    assert main(["--data", str(train)]) == 0  # what the message says to run
    assert set(FeatureStore(train).entries) == {f"s{s}-{u}" for s in range(5) for u in range(4)}


def test_odd_scp_forms_find_what_the_dict_did_and_errors_name_the_line(data):
    """feats.scp by key (speakerlab.dataio.tables.columns.read_keyed) gives the matrices the dict of read_table gave, in
    the form kaldiio writes (read vectorised) and in forms only the validating reader takes (tabs, a comment, lines
    out of order); a duplicate id is its error, with file and line."""
    assert main(["--data", str(data)]) == 0
    scp = data / FEATS_SCP
    lines = scp.read_text().splitlines()
    want = {u: kaldiio.load_mat(f[0]) for u, (_, f) in read_table(scp).items()}
    for text in (lines, [ln.replace(" ", "\t") for ln in lines], ["# fbank", ""] + lines[::-1]):
        scp.write_text("\n".join(text) + "\n")
        store = FeatureStore(data)
        assert len(store) == 3 and list(store.entries) == sorted(want) and "a-" not in store and "b-0" in store
        for utt, matrix in want.items():
            np.testing.assert_array_equal(store[utt], matrix)
        with pytest.raises(ListError, match=r"^'a-00' is not in the feature store \(3 utterances\)$"):
            store["a-00"]
    scp.write_text("\n".join(lines + [lines[0]]) + "\n")
    with pytest.raises(ListError, match=f"^{scp}:4: duplicate id 'a-0' \\(first on line 1\\)$"):
        FeatureStore(data)


def test_crops_read_by_row_and_a_missing_utterance_names_its_corpus(data, tmp_path):
    """A dataset finds each training utterance's row once (no search per item), in one store or in the stores of
    several corpora (`name/utt`); one not in its store is named with the command that rebuilds that store."""
    other = make_data_dir(tmp_path / "o", {"c-0": "c", "c-1": "c"}, seconds=0.4, seed=3)
    assert main(["--data", str(data), "--data", str(other)]) == 0
    store, joined = FeatureStore(data), JoinedStore({"x": FeatureStore(data), "y": FeatureStore(other)})
    ds = FeatureCropDataset(store, ["b-0", "a-0"], ["p", "q"], [1, 0], 16000, FbankConfig())
    assert ds.rows.tolist() == [2, 0] and ds.rows.dtype == np.int32
    utts = ["y/c-1", "x/b-0", "x/a-1"]
    ds = FeatureCropDataset(joined, utts, ["p"] * 3, [2, 1, 0], 16000, FbankConfig())
    assert ds.rows.tolist() == [4, 2, 1] and len(joined) == 5
    for i, utt in enumerate(utts):
        np.testing.assert_array_equal(joined.load(int(ds.rows[i])), joined[utt])
    alone = FeatureCropDataset(FeatureStore(other), ["c-1"], ["p"], [2], 16000, FbankConfig())
    assert np.array_equal(ds[(0, 3)]["feats"], alone[(0, 3)]["feats"]) and ds[(0, 3)]["label"] == 2
    with pytest.raises(ListError) as e:
        FeatureCropDataset(joined, ["x/a-0", "y/a-0", "y/c-9", "z/c-0"], ["p"] * 4, [0] * 4, 16000, FbankConfig())
    assert str(e.value) == (
        f"3 training utterance(s) not in the feature store, e.g. 'y/a-0'; re-run the features stage (recipe stage 2: "
        f"speakerlab-feature-store --data {other})"
    )


def test_a_store_of_200k_utterances_holds_arrays_not_a_dict(data):
    """What a store keeps of a feats.scp of 200k lines: the sorted fixed-width ids and two offset arrays (the
    file itself is memory-mapped: page cache, shared by the loader workers), about width + 8 bytes an utterance;
    the dict of str it replaces held ~190. A dataset over all of them adds its rows (4 bytes an utterance)."""
    assert main(["--data", str(data)]) == 0
    scp = data / FEATS_SCP
    where = [line.split()[1] for line in scp.read_text().splitlines()]
    n = 200_000
    ids = [f"id{i // 20:05d}-yt{i * 7919 % 10**9:09d}-{i % 20:05d}" for i in range(n)]  # sorted, as stores are
    scp.write_text("".join(f"{u} {where[i % 3]}\n" for i, u in enumerate(ids)))
    paths, labels = ["p"] * n, np.zeros(n, dtype=np.int32)
    tracemalloc.start()
    try:
        store = FeatureStore(data)
        held, _ = tracemalloc.get_traced_memory()
        ds = FeatureCropDataset(store, FixedView(store.entries.keys), paths, labels, 16000, FbankConfig())
        added = tracemalloc.get_traced_memory()[0] - held
    finally:
        tracemalloc.stop()
    assert len(store) == n and isinstance(store.entries.values.buf, np.memmap)
    assert held < (len(ids[0]) + 16) * n, held / n
    assert added < 8 * n, added / n
    np.testing.assert_array_equal(store[ids[n - 1]], kaldiio.load_mat(where[(n - 1) % 3]))
    np.testing.assert_array_equal(ds[(n - 1, 0)]["feats"], ds[(1, 0)]["feats"])  # rows of one matrix, one seed
