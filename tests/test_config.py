import re
from pathlib import Path

import pytest

from speakerlab.config import Config, ConfigError, load_config, save_config

BASE = "model:\n  name: campplus\ndata:\n  train: data/train\n"


def write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def test_defaults_and_overrides(tmp_path):
    cfg = load_config(
        write(tmp_path, BASE),
        [
            "train.epochs=3",
            "optim.lr=0.5",
            "model.args.embedding_size=64",
            "hardware.per_device_batch=32",
            "data.val=null",
        ],
    )
    assert isinstance(cfg, Config)
    assert cfg.train.epochs == 3 and cfg.optim.lr == 0.5 and isinstance(cfg.optim.lr, float)
    assert cfg.model.args == {"embedding_size": 64}
    assert cfg.hardware.per_device_batch == 32 and cfg.data.val is None


@pytest.mark.parametrize(
    "text,match",
    [
        (BASE + "train:\n  epoch: 3\n", "unknown config key 'train.epoch'"),
        (BASE + "trian:\n  epochs: 3\n", "unknown config key 'trian'"),
        (BASE + "train:\n  epochs: two\n", "config key 'train.epochs' must be an integer"),
        (BASE + "train:\n  epochs: 2.5\n", "config key 'train.epochs' must be an integer"),
        (BASE + "optim:\n  nesterov: 1\n", "config key 'optim.nesterov' must be true/false"),
        (BASE + "hardware:\n  precision: fp8\n", "config key 'hardware.precision' must be one of"),
        (BASE + "hardware:\n  per_device_batch: big\n", "hardware.per_device_batch"),
        (BASE + "train: 5\n", "config section 'train' must be a mapping"),
        ("data:\n  train: x\n", "config key 'model.name' is required"),
    ],
)
def test_bad_configs_name_the_key(tmp_path, text, match):
    p = write(tmp_path, text)
    with pytest.raises(ConfigError, match=match) as e:
        load_config(p)
    assert str(p) in str(e.value)


def test_bad_override_named(tmp_path):
    with pytest.raises(ConfigError, match="unknown config key 'train.epochz'"):
        load_config(write(tmp_path, BASE), ["train.epochz=3"])
    with pytest.raises(ConfigError, match="must look like key=value"):
        load_config(write(tmp_path, BASE), ["train.epochs"])


@pytest.mark.parametrize("override", ["optim.lr=[1", "model.args={embedding_size: 8", "train.epochs=@3"])
def test_override_that_is_not_yaml_names_the_override(tmp_path, override):
    with pytest.raises(ConfigError, match=f"override '{re.escape(override)}': its value is not valid YAML"):
        load_config(write(tmp_path, BASE), [override])


def test_yaml_syntax_error_names_line(tmp_path):
    p = write(tmp_path, BASE + "train:\n  epochs: [1, 2\n")
    with pytest.raises(ConfigError, match=f"{p}:\\d+: invalid YAML"):
        load_config(p)


@pytest.mark.parametrize(
    "text,line,match",
    [
        (BASE + "train: {epochs: 2}\ntrain: {seed: 3}\n", 6, "key 'train' given twice \\(first on line 5\\)"),
        (BASE + "optim:\n  lr: 0.1\n  lr: 0.2\n", 7, "key 'lr' given twice \\(first on line 6\\)"),
    ],
)
def test_a_key_given_twice_names_the_file_and_line(tmp_path, text, line, match):
    p = write(tmp_path, text)
    with pytest.raises(ConfigError, match=f"{re.escape(str(p))}:{line}: invalid YAML: {match}"):
        load_config(p)


def test_yaml_merge_keys_are_not_duplicates(tmp_path):
    p = write(tmp_path, BASE + "optim:\n  <<: {lr: 0.2, min_lr: 0.01}\n  lr: 0.5\n")
    assert load_config(p).optim.lr == 0.5


def test_a_config_that_is_not_utf8_names_the_file(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_bytes(b"\xff\xfe" + BASE.encode("utf-16-le"))
    with pytest.raises(ConfigError, match=f"config file {re.escape(str(p))} is not UTF-8 text"):
        load_config(p)


def test_hardware_profile_merge(tmp_path):
    cfg = load_config(write(tmp_path, BASE + "hardware:\n  num_workers: 7\n"), hardware="v100-32g")
    assert cfg.hardware.precision == "fp16" and cfg.hardware.per_device_batch == 64
    assert cfg.hardware.num_workers == 7  # the experiment's own key wins over the profile
    with pytest.raises(ConfigError, match="unknown hardware profile 'tpu'"):
        load_config(write(tmp_path, BASE), hardware="tpu")


def test_round_trip(tmp_path):
    cfg = load_config(write(tmp_path, BASE), ["train.epochs=4"])
    save_config(cfg, tmp_path / "out.yaml")
    assert load_config(tmp_path / "out.yaml") == cfg
    assert load_config(raw=cfg.to_dict()) == cfg


def test_overlay_deep_merges(tmp_path):
    base = write(
        tmp_path,
        "data:\n  train: data/train\ntrain:\n  epochs: 9\n  seed: 3\nmodel:\n  name: campplus\n  args: {a: 1, b: 2}\n",
    )
    over = tmp_path / "over.yaml"
    over.write_text("train:\n  epochs: 2\nmodel:\n  args: {b: 5}\n")
    cfg = load_config([base, over], ["train.seed=4"])
    assert (cfg.train.epochs, cfg.train.seed) == (2, 4)
    assert cfg.model.args == {"a": 1, "b": 5}
    over.write_text("train:\n  epoch: 2\n")
    with pytest.raises(ConfigError, match="unknown config key 'train.epoch'") as e:
        load_config([base, over])
    assert str(e.value).endswith(f" in {base}, {over}")


@pytest.mark.parametrize(
    "override,match",
    [
        ("train.log_every_steps=0", "'train.log_every_steps' must be >= 1, got 0"),
        ("train.val_every=0", "'train.val_every' must be >= 1, got 0"),
        ("train.keep_checkpoints=0", "'train.keep_checkpoints' must be >= 1, got 0"),
        ("train.keep_checkpoints=-1", "'train.keep_checkpoints' must be >= 1, got -1"),
        ("optim.min_lr=-0.5", "'optim.min_lr' must be >= 0, got -0.5"),
        ("optim.lr=0", "'optim.lr' must be > 0, got 0"),
        ("optim.momentum=1.0", "'optim.momentum' must be in \\[0, 1\\), got 1.0"),
        ("loss.margin=2", "'loss.margin' must be in \\[0, 1.5708\\), got 2.0"),
        ("data.crop_seconds=0", "'data.crop_seconds' must be > 0"),
        ("hardware.memory_margin=1.5", "'hardware.memory_margin' must be in \\(0, 1\\], got 1.5"),
        ("hardware.num_workers=-1", "'hardware.num_workers' must be >= 0"),
        ("features.num_mel_bins=0", "'features.num_mel_bins' must be in \\[1, 512\\], got 0"),
    ],
)
def test_out_of_range_values_name_the_key_and_the_override(tmp_path, override, match):
    with pytest.raises(ConfigError, match=match) as e:
        load_config(write(tmp_path, BASE), [override])
    assert str(e.value).endswith(f"in the command-line overrides {override}")  # not blamed on the file


def test_cross_field_rule_and_file_value_blamed_on_the_file(tmp_path):
    p = write(tmp_path, BASE + "optim:\n  lr: 0.01\n  min_lr: 0.1\n")
    with pytest.raises(ConfigError, match="'optim.min_lr' \\(0.1\\) must be <= optim.lr \\(0.01\\)"):
        load_config(p)
    p = write(tmp_path, BASE + "train:\n  val_every: 0\n")
    with pytest.raises(ConfigError, match=f"'train.val_every' must be >= 1, got 0 in {p}$"):
        load_config(p, ["train.epochs=3"])


def test_every_numeric_setting_has_a_range_rule():
    import dataclasses
    import typing

    for section in dataclasses.fields(Config):
        cls = section.default_factory
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if hints[f.name] in (int, float):
                rule = f.metadata
                assert any(rule.get(k) is not None for k in ("ge", "gt", "le", "lt", "choices", "check")), (
                    f"{section.name}.{f.name} has no rule"
                )


def test_model_args_are_checked_against_the_builder(tmp_path):
    from speakerlab.train.build import load_train_config

    p = write(tmp_path, "model:\n  name: campplus\n  args: {embeding_size: 64}\ndata:\n  train: data/train\n")
    with pytest.raises(ConfigError, match="'model.args.embeding_size': model 'campplus' has no argument") as e:
        load_train_config([str(p)], [], None)
    assert str(p) in str(e.value)
    with pytest.raises(ConfigError, match="'model.args.embeding_size'") as e:  # an override's key: not blamed on p
        load_train_config([str(write(tmp_path, BASE))], ["train.epochs=3", "model.args.embeding_size=64"], None)
    assert str(e.value).endswith(" with overrides train.epochs=3 model.args.embeding_size=64")
    with pytest.raises(ConfigError, match="'model.name': unknown model 'campplux'"):
        load_train_config([str(write(tmp_path, "model:\n  name: campplux\ndata:\n  train: x\n"))], [], None)


CONF = Path(__file__).resolve().parent.parent / "conf"
# speakerlab-train configs; conf/diarization/ holds speakerlab-segmentation-train's, conf/hardware/ the profiles.
SHIPPED = sorted(
    str(p.relative_to(CONF)) for p in CONF.rglob("*.yaml") if p.parent.name not in ("hardware", "diarization")
)
SEGMENTATION = sorted(str(p.relative_to(CONF)) for p in (CONF / "diarization").glob("*.yaml"))
CORPORA = ("3dspeaker", "voxceleb", "cnceleb")
_NETS = {}  # (model, args, features, head) -> (logits shape, loss finite): each distinct net is built once


def _train_config(name):
    import json

    import yaml

    from speakerlab.train.build import load_train_config

    # Fine-tuning / augmentation overlays go on the mini config; those of an SSL back-end (conf/ssl/<model>_<stage>)
    # on its VoxCeleb config.
    stem = Path(name).stem.rsplit("_", 1)[0]
    base = CONF / ("voxceleb/ssl_" + stem + ".yaml" if name.startswith("ssl/") else "mini/campplus.yaml")
    raw = yaml.safe_load((CONF / name).read_text())
    overlay = "name" not in (raw.get("model") or {})
    paths = [str(base), str(CONF / name)] if overlay else [str(CONF / name)]
    # A fine-tuning config's frozen trunk needs train.init, a pretrained model this test does not have.
    extra = ["train.freeze=[]"] if "freeze" in (raw.get("train") or {}) else []
    cfg, _ = load_train_config(paths, ["data.train=x", *extra], None)
    if cfg.model.args.get("pretrained"):  # no published encoder can be downloaded here: a tiny one of its family
        from tests.helpers import TINY_ENCODERS

        family = "wav2vec2-bert" if cfg.features.kind == "w2vbert_fbank" else "wavlm"
        tiny = f"model.args.encoder={json.dumps(TINY_ENCODERS[family])}"  # JSON is YAML
        cfg, _ = load_train_config(paths, ["data.train=x", "model.args.pretrained=null", tiny, *extra], None)
    return cfg


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_config_builds_its_model_and_head(name):
    """Every YAML under conf/ (overlays on top of the mini config) loads, passes the model-argument check,
    and builds its embedding model and classifier, which give a finite loss on a small batch."""
    import contextlib
    import json

    import torch

    from speakerlab.train.build import build_net, example_input, make_features

    cfg = _train_config(name)
    l = cfg.loss
    key = (
        cfg.model.name,
        json.dumps(cfg.model.args, sort_keys=True),
        cfg.features.kind,
        cfg.features.num_mel_bins,
        l.name,
        l.scale,
        l.sphereface2_lambda,
        l.sphereface2_t,
        cfg.dino.distill_weight > 0,
        cfg.dino.prototypes,
    )
    if key not in _NETS and l.name == "dino":  # waves in: the net cuts the crops and computes their features
        torch.manual_seed(0)
        net = build_net(cfg, 0, contextlib.nullcontext, make_features(cfg, torch.device("cpu")))
        net.classifier.set_step(0)
        with torch.no_grad():
            loss, top1 = net(0.1 * torch.randn(2, int(cfg.data.crop_seconds * 16000)), torch.tensor([0, 6]))
        outputs = net.classifier.head.directions.shape[0] if net.classifier.distill else 0  # SimCLR: no prototypes
        _NETS[key] = ((len(top1), outputs), bool(torch.isfinite(loss)))
    if key not in _NETS:  # the same key builds the same net: its forward is checked once
        torch.manual_seed(0)
        net = build_net(cfg, 7, contextlib.nullcontext)
        with torch.no_grad():
            x = example_input(cfg, 0.66)
            loss, top1 = net(torch.cat([x, x]), torch.tensor([0, 6]))
        _NETS[key] = ((len(top1), net.classifier.weight.shape[0]), bool(torch.isfinite(loss)))
    classes = 7
    if l.name == "dino":  # DINO's head: its prototypes; SimCLR (no self-distillation) has none
        classes = cfg.dino.prototypes if cfg.dino.distill_weight > 0 else 0
    assert _NETS[key] == ((2, classes), True), name


@pytest.mark.parametrize("name", SEGMENTATION)
def test_every_segmentation_config_loads_into_its_settings(name):
    """conf/diarization/*.yaml are speakerlab-segmentation-train's: each loads into its typed settings."""
    from speakerlab.diarization.segmentation_train import read_settings

    settings = read_settings(str(CONF / name), [])
    assert settings.steps > 0 and settings.window > 0, name


def test_hardware_profiles_load_on_top_of_a_config():
    from speakerlab.train.build import load_train_config

    for p in sorted((CONF / "hardware").glob("*.yaml")):
        cfg, _ = load_train_config([str(CONF / "mini" / "campplus.yaml")], ["data.train=x"], p.stem)
        assert cfg.hardware.precision in ("auto", "bf16", "fp16", "fp32"), p.name


def _header_commands(text):
    """The `bash egs/<recipe>/run.sh ...` commands in a config's leading comment block."""
    head = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        head.append(line.lstrip("#").strip())
    return [c.split() for c in head if c.startswith("bash egs/")]


@pytest.mark.parametrize("name", SHIPPED + SEGMENTATION)
def test_every_config_header_names_the_command_that_runs_it(name):
    """The comment header holds a `bash egs/<recipe>/run.sh` command passing this very file as --config (or, for
    an overlay, --lm_config / --augment_config / --ft_config / --scratch_config; a segmentation config
    --seg_config), and that recipe exists and takes that option; a <corpus>/<model>.yaml file's command runs the
    <corpus> recipe."""
    root = CONF.parent
    found = []
    for words in _header_commands((CONF / name).read_text()):
        for opt in ("--config", "--lm_config", "--augment_config", "--ft_config", "--scratch_config", "--seg_config"):
            if opt in words[:-1] and words[words.index(opt) + 1] == f"../../conf/{name}":
                found.append((words[1], opt))
    assert found, f"{name}: no 'bash egs/<recipe>/run.sh ... --config ../../conf/{name}' in its header"
    for script, opt in found:
        run_sh = root / script
        assert run_sh.is_file(), f"{name}: {script} does not exist"
        assert f"opt {opt[2:]} " in run_sh.read_text(), f"{name}: {script} has no {opt} option"
    corpus = name.split("/")[0]
    if corpus in CORPORA:
        assert any(script == f"egs/{corpus}/run.sh" for script, _ in found), name


def test_every_registered_model_has_a_config_per_corpus():
    import yaml

    from speakerlab.models import list_models

    for model in list_models():
        for corpus in CORPORA:
            p = CONF / corpus / f"{model}.yaml"
            assert p.is_file(), f"missing {p.relative_to(CONF)}"
            assert yaml.safe_load(p.read_text())["model"]["name"] == model, p.name


@pytest.mark.slow
def test_an_installed_wheel_resolves_the_hardware_profiles_by_name(tmp_path):
    """A non-editable install (no checkout next to it) still finds `--hardware h100-80g`: the profiles of
    conf/hardware ride in the wheel as speakerlab/hardware."""
    import importlib.util
    import shutil
    import subprocess
    import sys

    # Built without network (--no-build-isolation): setuptools must build wheels by itself (>= 70.1) or
    # have the `wheel` package beside it.
    setuptools = pytest.importorskip("setuptools")
    if tuple(int(v) for v in setuptools.__version__.split(".")[:2]) < (70, 1) and not importlib.util.find_spec("wheel"):
        pytest.skip(f"setuptools {setuptools.__version__} without the wheel package cannot build a wheel offline")
    src = tmp_path / "src"
    shutil.copytree(CONF.parent / "speakerlab", src / "speakerlab", symlinks=True)
    shutil.copytree(CONF / "hardware", src / "conf" / "hardware")
    shutil.copy(CONF.parent / "pyproject.toml", src)
    pip = [sys.executable, "-m", "pip", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", str(src), "-w", str(tmp_path)], check=True)
    wheel = next(tmp_path.glob("speakerlab_recipes-*.whl"))
    subprocess.run([*pip, "install", "--no-deps", "--target", str(tmp_path / "site"), str(wheel)], check=True)
    code = "from speakerlab.config import resolve_hardware as r; p = r('h100-80g'); print(p, p.read_text())"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path / "site")},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.startswith(str(tmp_path / "site" / "speakerlab" / "hardware" / "h100-80g.yaml"))
    assert (CONF / "hardware" / "h100-80g.yaml").read_text() in out


def test_every_ssl_model_has_a_voxceleb_and_a_3dspeaker_config():
    import yaml

    from speakerlab.models import list_ssl_models

    for model in list_ssl_models():
        for corpus in ("voxceleb", "3dspeaker"):
            p = CONF / corpus / f"{model}.yaml"
            assert p.is_file(), f"missing {p.relative_to(CONF)}"
            assert yaml.safe_load(p.read_text())["model"]["name"] == model, p.name
