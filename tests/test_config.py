import pytest

from speakerlab.config import Config, ConfigError, config_from_dict, load_config, save_config

BASE = "model:\n  name: campplus\ndata:\n  train: data/train\n"


def write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def test_defaults_and_overrides(tmp_path):
    cfg = load_config(write(tmp_path, BASE), ["train.epochs=3", "optim.lr=0.5", "model.args.embedding_size=64",
                                              "hardware.per_device_batch=32", "data.val=null"])
    assert isinstance(cfg, Config)
    assert cfg.train.epochs == 3 and cfg.optim.lr == 0.5 and isinstance(cfg.optim.lr, float)
    assert cfg.model.args == {"embedding_size": 64}
    assert cfg.hardware.per_device_batch == 32 and cfg.data.val is None


@pytest.mark.parametrize("text,match", [
    (BASE + "train:\n  epoch: 3\n", "unknown config key 'train.epoch'"),
    (BASE + "trian:\n  epochs: 3\n", "unknown config key 'trian'"),
    (BASE + "train:\n  epochs: two\n", "config key 'train.epochs' must be an integer"),
    (BASE + "train:\n  epochs: 2.5\n", "config key 'train.epochs' must be an integer"),
    (BASE + "optim:\n  nesterov: 1\n", "config key 'optim.nesterov' must be true/false"),
    (BASE + "hardware:\n  precision: fp8\n", "config key 'hardware.precision' must be one of"),
    (BASE + "hardware:\n  per_device_batch: big\n", "hardware.per_device_batch"),
    (BASE + "train: 5\n", "config section 'train' must be a mapping"),
    ("data:\n  train: x\n", "config key 'model.name' is required"),
])
def test_bad_configs_name_the_key(tmp_path, text, match):
    p = write(tmp_path, text)
    with pytest.raises(ConfigError, match=match) as e:
        load_config(p)
    assert str(p) in str(e.value)


def test_bad_override_named(tmp_path):
    with pytest.raises(ConfigError, match="unknown config key 'train.epochz'"):
        load_config(write(tmp_path, BASE), ["train.epochz=3"])
    with pytest.raises(ConfigError, match="must look like section.key=value"):
        load_config(write(tmp_path, BASE), ["train.epochs"])


def test_yaml_syntax_error_names_line(tmp_path):
    p = write(tmp_path, BASE + "train:\n  epochs: [1, 2\n")
    with pytest.raises(ConfigError, match=f"{p}:\\d+: invalid YAML"):
        load_config(p)


def test_hardware_profile_merge(tmp_path):
    cfg = load_config(write(tmp_path, BASE + "hardware:\n  num_workers: 7\n"), hardware="v100-32g")
    assert cfg.hardware.precision == "fp16" and cfg.hardware.per_device_batch == 64
    assert cfg.hardware.num_workers == 7  # the experiment's own key wins over the profile
    with pytest.raises(ConfigError, match="unknown hardware profile 'tpu'"):
        load_config(write(tmp_path, BASE), hardware="tpu")


def test_every_shipped_config_and_profile_loads():
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent / "conf"
    for p in sorted(root.glob("*.yaml")):
        if "finetune" in p.name:  # overlays: valid on top of a recipe config
            load_config([root / "mini_campplus.yaml", p])
        else:
            load_config(p)
    for p in sorted((root / "hardware").glob("*.yaml")):
        load_config(root / "mini_campplus.yaml", hardware=p.stem)


def test_round_trip(tmp_path):
    cfg = load_config(write(tmp_path, BASE), ["train.epochs=4"])
    save_config(cfg, tmp_path / "out.yaml")
    assert load_config(tmp_path / "out.yaml") == cfg
    assert config_from_dict(cfg.to_dict()) == cfg


def test_overlay_deep_merges(tmp_path):
    base = write(tmp_path, BASE + "train:\n  epochs: 9\n  seed: 3\nmodel:\n  name: campplus\n  args: {a: 1, b: 2}\n")
    over = tmp_path / "over.yaml"
    over.write_text("train:\n  epochs: 2\nmodel:\n  args: {b: 5}\n")
    cfg = load_config([base, over], ["train.seed=4"])
    assert (cfg.train.epochs, cfg.train.seed) == (2, 4)
    assert cfg.model.args == {"a": 1, "b": 5}
    over.write_text("train:\n  epoch: 2\n")
    with pytest.raises(ConfigError, match="unknown config key 'train.epoch'") as e:
        load_config([base, over])
    assert str(e.value).endswith(f" in {base}, {over}")
