"""Several corpora in one run (speakerlab.dataio.tables.corpora) and the compact lists under them
(speakerlab.dataio.tables.compact): the same lists and errors as the validating reader, namespaced speakers, sampling
weights that keep the order hardware-independent and resumable, per-corpus validation, the feature store and
tar shards, fine-tuning onto another speaker set, and the bad inputs."""

import re

import numpy as np
import pytest
import yaml

from speakerlab.checkpoint import load_checkpoint
from speakerlab.dataio.loaders.batches import GlobalBatchSampler
from speakerlab.dataio.loaders.shards import main as shards_main
from speakerlab.dataio.tables.columns import as_keys, read_keyed
from speakerlab.dataio.tables.compact import read_compact
from speakerlab.dataio.tables.corpora import read_manifest
from speakerlab.dataio.tables.lists import ListError, load_data_dir, read_table
from speakerlab.dataio.tables.prepare import main as prepare_main
from speakerlab.features.store import main as store_main
from speakerlab.train.loop import main as train_main
from tests.helpers import TINY_MODEL, losses, make_data_dir


def corpus(root, speakers=("s0", "s1", "s2"), utts=4, seed=0, trials=None):
    return make_data_dir(root, {f"{s}-{u}": s for s in speakers for u in range(utts)}, 0.6, seed, trials)


def same_lists(compact, data):
    utts, paths = compact.utts(), compact.paths
    assert [utts[i] for i in range(len(compact))] == data.utts
    assert [paths[i] for i in range(len(compact))] == [data.wav[u] for u in data.utts]
    assert [compact.line(i) for i in range(len(compact))] == [data.wav_line[u] for u in data.utts]
    speakers = [s.decode() for s in compact.speakers.tolist()]
    assert speakers == data.speakers
    assert [speakers[k] for k in compact.labels] == [data.utt2spk[u] for u in data.utts]
    if data.num_samples:
        assert compact.lengths.tolist() == [data.num_samples[u] for u in data.utts]


def test_compact_lists_are_the_validating_readers(tmp_path, monkeypatch):
    """Shuffled lines, spk2utt and utt2num_samples (fast path, its keys built 5 rows at a time: across chunk
    boundaries); then tabs and a comment (the validating reader)."""
    monkeypatch.setattr("speakerlab.dataio.tables.columns.CHUNK", 5)
    root = corpus(tmp_path / "d", speakers=("b", "a", "c"))
    assert prepare_main(["--data", str(root)]) == 0
    lines = (root / "wav.scp").read_text().splitlines()
    (root / "wav.scp").write_text("\n".join(lines[::-1]) + "\n")
    same_lists(read_compact(root), load_data_dir(root))
    (root / "utt2spk").write_text("# speakers\n" + (root / "utt2spk").read_text().replace(" ", "\t"))
    same_lists(read_compact(root), load_data_dir(root))


def test_compact_lists_are_kept_and_mapped_until_a_list_changes(tmp_path):
    """The first read writes .compact/, the next maps it (memmaps: nothing parsed); a changed utt2spk is read anew."""
    root = corpus(tmp_path / "d")
    first = read_compact(root)
    assert (root / ".compact" / "meta.json").is_file() and not isinstance(first.labels, np.memmap)
    again = read_compact(root)
    assert isinstance(again.labels, np.memmap) and isinstance(again.buf, np.memmap)
    same_lists(again, load_data_dir(root))
    (root / "utt2spk").write_text((root / "utt2spk").read_text().replace(" s2\n", " s1\n"))
    changed = read_compact(root)
    assert not isinstance(changed.labels, np.memmap) and len(changed.speakers) == 2
    same_lists(changed, load_data_dir(root))


@pytest.mark.parametrize(
    "file,text",
    [
        ("wav.scp", "a-0 /x.wav\na-0 /y.wav\n"),  # duplicate id
        ("utt2spk", "a-0 a\n"),  # an utterance without a speaker
        ("spk2utt", "a a-0 b-0\nb a-1\n"),  # not the inverse of utt2spk
        ("utt2num_samples", "a-0 100\na-1 -3\nb-0 5\n"),  # a bad count
    ],
)
def test_compact_errors_are_the_validating_readers(tmp_path, file, text):
    root = make_data_dir(tmp_path / "d", {"a-0": "a", "a-1": "a", "b-0": "b"}, seconds=0.2)
    (root / file).write_text(text)
    with pytest.raises(ListError) as want:
        load_data_dir(root)
    with pytest.raises(ListError) as got:
        read_compact(root)
    assert str(got.value) == str(want.value)


KEYED = {"ab": "/f.ark:12", "abc": "/f.ark:40", "b.1": "/g.ark:7", "ü-1": "/f.ark:99", "z/9": "/f.ark:3"}


@pytest.mark.parametrize("form", ["sorted", "unsorted", "tabs", "comment"])
def test_keyed_lists_find_what_the_validating_reader_reads(tmp_path, form):
    """read_keyed (feats.scp and the like) gives read_table's key -> value, one key at a time or many (`rows`):
    keys that are prefixes of others, longer than any, UTF-8. One space per line is read vectorised (the file
    mapped); tabs, comments and blank lines go through read_table."""
    lines = [f"{k} {v}" for k, v in KEYED.items()]
    lines = lines[::-1] if form == "unsorted" else lines
    text = {"tabs": "\n".join(ln.replace(" ", "\t") for ln in lines), "comment": "# feats\n\n" + "\n".join(lines)}
    path = tmp_path / "feats.scp"
    path.write_text(text.get(form, "\n".join(lines)) + "\n")
    table = {k: f[0] for k, (_, f) in read_table(path).items()}
    column = read_keyed(path)
    assert isinstance(column.values.buf, np.memmap) == (form in ("sorted", "unsorted"))
    assert list(column) == sorted(table) and len(column) == len(table) == 5
    assert {k: column[k] for k in column} == table == KEYED
    probes = ["", "a", "ab", "abc", "abcd", "abcdef", "b", "b.1", "ü", "ü-1", "z/9", "zz"]
    assert [p in column for p in probes] == [p in table for p in probes]
    assert column.rows(as_keys(probes)).tolist() == [sorted(table).index(p) if p in table else -1 for p in probes]
    with pytest.raises(KeyError):
        column["abcd"]


@pytest.mark.parametrize(
    "text,message",
    [
        ("a x\nb y\na z\n", ":3: duplicate id 'a' (first on line 1)"),
        ("a x\nb y z\n", ":2: expected 2 fields, got 3: 'b y z'"),
        (b"a x\nb \xff\n", ":2: not UTF-8 text"),
        (None, ": file does not exist"),
    ],
    ids=["duplicate", "fields", "not-utf8", "missing"],
)
def test_keyed_list_errors_name_the_file_and_line(tmp_path, text, message):
    path = tmp_path / "feats.scp"
    if text is not None:
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ListError) as got:
        read_keyed(path)
    assert str(got.value).startswith(f"{path}{message}"), got.value


def epoch_items(sampler, epoch, start=0):
    sampler.set_epoch(epoch, start)
    return [i for batch in sampler for i, _ in batch]


def test_weights_draw_passes_over_each_corpus():
    """Corpus 0 (11 items, weight 1) once, corpus 1 (6, weight 0.5) three of them, a new three each epoch,
    corpus 2 (4, weight 2.5) each twice plus two: 24 items, 8 steps of 3; resumed mid-epoch, the same rest;
    weights all 1: the one-corpus order."""
    blocks = [(11, 1.0), (6, 0.5), (4, 2.5)]
    s = GlobalBatchSampler(21, 3, 3, 1, seed=5, blocks=blocks)
    assert s.epoch_items == 24 and s.steps_per_epoch == 8
    seen = [np.bincount(epoch_items(s, e), minlength=21) for e in range(3)]
    for counts in seen:
        assert (counts[:11] == 1).all() and (counts[11:17] <= 1).all() and counts[11:17].sum() == 3
        assert sorted(counts[17:]) == [2, 2, 3, 3]
    assert not np.array_equal(seen[0][11:17], seen[1][11:17])
    assert epoch_items(s, 2, start=4) == epoch_items(s, 2)[12:]
    plain = GlobalBatchSampler(20, 4, 2, 2, seed=5)
    ones = GlobalBatchSampler(20, 4, 2, 2, seed=5, blocks=[(12, 1.0), (8, 1.0)])
    assert epoch_items(plain, 3) == epoch_items(ones, 3)


def test_weighted_order_does_not_depend_on_the_world_size():
    blocks = [(9, 1.5), (7, 0.5)]
    one = epoch_items(GlobalBatchSampler(16, 4, 4, 1, seed=2, blocks=blocks), 1)
    ranks = [epoch_items(GlobalBatchSampler(16, 4, 1, 2, r, 2, seed=2, blocks=blocks), 1) for r in range(2)]
    merged = []
    for step in range(len(one) // 4):  # step k: rank 0's two micro-batches are positions 0 and 2 of the step
        for a in range(2):
            for r in range(2):
                merged.append(ranks[r][step * 2 + a])
    assert merged == one


def write_config(tmp_path, train, extra="", name="multi.yaml"):
    cfg = tmp_path / name
    cfg.write_text(
        TINY_MODEL
        + f"""
data: {{train: {train}, crop_seconds: 0.5}}
features: {{dither: 0.0}}
loss: {{margin: 0.2}}
optim: {{lr: 0.05, warmup_epochs: 0.5}}
train: {{epochs: 1, global_batch_size: 8, log_every_steps: 1, save_every_steps: 1}}
hardware: {{device: cpu, precision: fp32, per_device_batch: 4, num_workers: 0, pin_memory: false}}
{extra}"""
    )
    return str(cfg)


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """Two corpora with the same speaker ids (s0-s2), the second with a validation dir, and a manifest of them."""
    root = tmp_path_factory.mktemp("two")
    trials = "".join(f"s{a}-0 s{b}-1 {'target' if a == b else 'nontarget'}\n" for a in range(3) for b in range(3))
    a, b = corpus(root / "a"), corpus(root / "b", seed=3)
    val = corpus(root / "val", utts=2, seed=5, trials=trials)
    (root / "corpora.yaml").write_text(
        yaml.safe_dump([{"name": "a", "dir": str(a)}, {"name": "b", "dir": str(b), "weight": 0.5, "val": str(val)}])
    )
    return root


def test_two_corpora_train_with_namespaced_speakers(two, tmp_path):
    """The manifest: 6 speakers (a/s0 .. b/s2), 12 + 6 utterances an epoch (2 steps of 8), corpus b's EER
    logged; the run records the corpora themselves; a pre-training fine-tuned on corpus b alone (the same
    namespace) starts its 3 speakers from the pre-trained rows."""
    exp = tmp_path / "exp"
    assert train_main(["--config", write_config(tmp_path, two / "corpora.yaml"), "--exp-dir", str(exp)]) == 0
    ck = load_checkpoint(exp / "checkpoints" / "epoch_001.pt")
    assert ck.speakers == ["a/s0", "a/s1", "a/s2", "b/s0", "b/s1", "b/s2"] and ck.classifier["weight"].shape[0] == 6
    log = (exp / "train.log").read_text()
    assert "a: 12 utterances, 3 speakers; b: 12 utterances, 3 speakers, weight 0.5" in log
    assert sorted(losses(exp)) == [1, 2]
    assert re.search(r"epoch 1: validation EER b \(.*val\) \d+\.\d\d%", log)
    recorded = yaml.safe_load((exp / "config.yaml").read_text())["data"]["train"]
    assert [c["name"] for c in recorded] == ["a", "b"] and recorded[1]["weight"] == 0.5
    only_b = yaml.safe_dump([{"name": "b", "dir": str(two / "b")}], default_flow_style=True).strip()
    ft = ["--config", write_config(tmp_path, only_b, name="ft.yaml"), "--exp-dir", str(tmp_path / "ft")]
    assert train_main(ft + [f"train.init={exp}", "train.init_match_speakers=true"]) == 0
    log = (tmp_path / "ft" / "train.log").read_text()
    assert "new classifier for 3 speakers, 3 of them (same speaker id) starting from the source's rows" in log
    start = load_checkpoint(tmp_path / "ft" / "checkpoints" / "epoch_001.pt")
    assert start.speakers == ["b/s0", "b/s1", "b/s2"]


def test_two_corpora_from_feature_stores_and_from_shards(two, tmp_path):
    listed = yaml.safe_dump(
        [{"name": "a", "dir": str(two / "a")}, {"name": "b", "dir": str(two / "b")}], default_flow_style=True
    ).strip()
    assert store_main(["--data", str(two / "a"), "--data", str(two / "b")]) == 0
    cfg = write_config(tmp_path, listed)
    assert train_main(["--config", cfg, "--exp-dir", str(tmp_path / "f"), "data.feats=true"]) == 0
    assert sorted(losses(tmp_path / "f")) == [1, 2, 3]
    manifest = tmp_path / "ab.yaml"
    manifest.write_text(yaml.safe_dump(yaml.safe_load(listed)))
    assert shards_main(["--data", str(manifest), "--out", str(tmp_path / "shards"), "--per-shard", "5"]) == 0
    assert train_main(["--config", cfg, "--exp-dir", str(tmp_path / "s"), f"data.shards={tmp_path / 'shards'}"]) == 0
    ck = load_checkpoint(tmp_path / "s" / "checkpoints" / "epoch_001.pt")
    assert ck.speakers == ["a/s0", "a/s1", "a/s2", "b/s0", "b/s1", "b/s2"]


@pytest.mark.parametrize(
    "corpora,message",
    [
        ([{"name": "a", "dir": "A"}, {"name": "a", "dir": "B"}], "config key 'data.train[1].name': 'a' is also the"),
        ([{"name": "a", "dir": "A", "weight": 0}], "config key 'data.train[0].weight' must be > 0, got 0"),
        (
            [{"name": "a", "dir": "NOUTT2SPK"}],
            "NOUTT2SPK/utt2spk: file does not exist, and loss.name aam classifies speakers "
            "(config key 'data.train[0]')",
        ),
        ([{"name": "a/b", "dir": "A"}], "config key 'data.train[0].name' must be a speaker-id namespace without"),
        ([{"name": "a", "dir": "A", "weight": 2.0}], "config key 'data.train[0].weight' (2): tar shards"),
        (
            [{"name": "a", "dir": "A"}, {"name": "f", "dir": "FILE"}],
            "FILE is a file, not a folder (config key 'data.train[1]')",
        ),
    ],
    ids=["same-namespace", "weight-0", "no-utt2spk", "slash", "weight-with-shards", "dir-is-a-file"],
)
def test_bad_corpora_are_one_line_naming_the_key(two, tmp_path, capsys, corpora, message):
    no_utt2spk = corpus(tmp_path / "n")
    (no_utt2spk / "utt2spk").unlink()
    for c in corpora:
        c["dir"] = {
            "A": str(two / "a"),
            "B": str(two / "b"),
            "NOUTT2SPK": str(no_utt2spk),
            "FILE": str(two / "corpora.yaml"),
        }[c["dir"]]
    listed = yaml.safe_dump(corpora, default_flow_style=True).strip()
    args = ["--config", write_config(tmp_path, listed), "--exp-dir", str(tmp_path / "x")]
    assert train_main(args + ([f"data.shards={tmp_path}"] if "shards" in message else [])) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert message.replace("NOUTT2SPK", str(no_utt2spk)).replace("FILE", str(two / "corpora.yaml")) in err, err
    assert not (tmp_path / "x" / "checkpoints").exists()


def test_a_manifest_reads_its_relative_dirs_from_its_own_folder(two, tmp_path, monkeypatch):
    """`dir: a` in conf/corpora.yaml is conf/a, wherever the command runs: the check passes and the corpus read
    is the one beside the manifest (from another directory, `a` names nothing)."""
    conf = tmp_path / "conf"
    conf.mkdir()
    for name in ("a", "b"):
        (conf / name).symlink_to(two / name)
    (conf / "corpora.yaml").write_text("- {name: a, dir: a}\n- {name: b, dir: ./b, val: ../conf/b}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = write_config(tmp_path, conf / "corpora.yaml")
    assert train_main(["--config", cfg, "--exp-dir", str(tmp_path / "x"), "--check"]) == 0
    read = read_manifest(conf / "corpora.yaml")
    assert [load_data_dir(c.dir).utts for c in read] == [load_data_dir(two / n).utts for n in ("a", "b")]
    assert read[1].val == str(conf / "../conf/b")


@pytest.mark.parametrize("check", [True, False], ids=["check", "start"])
def test_a_listed_dir_that_does_not_exist_is_found_by_the_check(two, tmp_path, capsys, check):
    """--check finds what the start finds: the manifest's file and line, or the inline list's key."""
    manifest = tmp_path / "corpora.yaml"
    manifest.write_text(f"# two corpora\n- {{name: a, dir: {two / 'a'}}}\n- {{name: b, dir: no_such_dir}}\n")
    inline = [{"name": "a", "dir": str(two / "a")}, {"name": "b", "dir": str(tmp_path / "gone")}]
    cases = [
        (manifest, f"{manifest}:3: dir {tmp_path / 'no_such_dir'} does not exist (config key 'data.train[1].dir')"),
        (
            yaml.safe_dump(inline, default_flow_style=True).strip(),
            f"{tmp_path / 'gone'} does not exist (config key 'data.train[1]')",
        ),
    ]
    for i, (train, message) in enumerate(cases):
        cfg = write_config(tmp_path, train, name=f"c{i}.yaml")
        exp = tmp_path / f"x{i}"
        assert train_main(["--config", cfg, "--exp-dir", str(exp)] + (["--check"] if check else [])) == 2
        err = capsys.readouterr().err.strip()
        assert err == f"error: {message}", err
        assert not exp.exists()
