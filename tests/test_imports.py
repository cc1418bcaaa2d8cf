"""The package's import structure: the layer table, no cycles, inference independent of training, a pure
config module.

Imports are read from the source (module level and inside functions alike), so an import hidden in a
function counts too.
"""

import ast
import subprocess
import sys
from pathlib import Path
from typing import Dict, Set

PACKAGE = Path(__file__).resolve().parent.parent / "speakerlab"

# Which layer may import which (a layer may always import itself). Data flows top-down: lists and audio
# -> features -> models -> training -> checkpoint -> inference -> scores; a lower layer never reaches up,
# so inference runs without anything of the training side.
# frontends: the front-end registry (kinds, their settings and the config's features section), torch-free so
# that config can read it; objectives, the self-supervised objectives' settings (the config's dino section),
# augment_settings and hardware_settings, its augment and hardware sections, alike. sources: the one reader of
# pretrained models (ours, 3D-Speaker, ReDimNet2 releases), between checkpoint and inference, because it needs
# models and the front-end registry and both inference and train read through it.
# `commands` (the parser and the ending of every console script), `outputs` (the one writer of output files) and
# `stopping` (stop signals recorded, and the exit codes of a command they stopped) are leaves every layer may import.
LEAVES = {"commands", "outputs", "stopping"}
LAYERS: Dict[str, Set[str]] = {
    "settings": set(),
    "frontends": {"settings"},
    "objectives": {"settings"},
    "augment_settings": {"settings"},
    "hardware_settings": {"settings"},
    "config": {"settings", "frontends", "objectives", "augment_settings", "hardware_settings"},
    "devices": set(),
    "commands": set(),
    "outputs": set(),
    "stopping": set(),
    "dataio": {"config", "augment_settings", "settings", "devices", "commands"},
    "features": {"dataio", "config", "devices", "frontends", "commands"},
    "models": set(),
    "checkpoint": {"frontends", "models"},
    "sources": {"checkpoint", "features", "frontends", "models"},
    "scoring": {"dataio", "commands"},
    "inference": {
        "sources",
        "checkpoint",
        "features",
        "frontends",
        "models",
        "dataio",
        "scoring",
        "devices",
        "commands",
    },
    # Diarization consumes embedders as scoring consumes embeddings: inference's Embedder, audio and lists
    # of dataio; nothing of the training side.
    # settings: the segmentation trainer's typed config.
    "diarization": {"inference", "dataio", "settings", "commands"},
    # Identification consumes embedders (inference, the ONNX runtime included) and the model's calibration (scoring).
    "identification": {"inference", "scoring", "dataio", "commands"},
    "train": {
        "config",
        "objectives",
        "settings",
        "devices",
        "dataio",
        "frontends",
        "features",
        "models",
        "checkpoint",
        "sources",
        "inference",
        "scoring",
        "commands",
    },
    "datasets": {"dataio", "commands"},
    "synth": {"dataio", "commands"},
}


# Rooms: a layer of more than ~12 modules is split by concern into subpackages, and inside it data flows top-down
# too (a room may always import itself). dataio: the one audio reader; the text tables (lists, trials, RTTM,
# embeddings I/O); the signal transforms (resampling, speed, noise bank, augmentation, degradations); the loaders
# (crops, batches, shards) on top.
ROOMS: Dict[str, Dict[str, Set[str]]] = {
    "dataio": {
        "audio": set(),
        "tables": {"audio"},
        "waveform": {"audio", "tables"},
        "loaders": {"audio", "tables", "waveform"},
    },
}


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> str:
    """`speakerlab.dataio.tables.lists` -> `dataio`; `speakerlab.config` -> `config`; the package itself -> ``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def import_graph() -> Dict[str, Set[str]]:
    """speakerlab module -> the speakerlab modules its source imports."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from speakerlab.models import campplus` imports the submodule when there is one
                targets = [
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                    for a in node.names
                ]
            else:
                continue
            deps |= {t for t in targets if t.startswith("speakerlab") and t in modules and t != name}
        graph[name] = deps
    return graph


def reachable(graph: Dict[str, Set[str]], start: str) -> Set[str]:
    seen, todo = set(), [start]
    while todo:
        for dep in graph[todo.pop()]:
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def test_every_module_belongs_to_a_layer_of_the_table():
    unknown = sorted(m for m in import_graph() if layer(m) and layer(m) not in LAYERS)
    assert not unknown, f"modules outside the layer table: {unknown}"


def test_every_import_follows_the_layer_table():
    graph = import_graph()
    bad = [
        f"{m} ({layer(m)}) imports {d} ({layer(d)})"
        for m, deps in sorted(graph.items())
        for d in sorted(deps)
        if layer(m) and layer(d) != layer(m) and layer(d) not in LAYERS[layer(m)] | LEAVES | {""}
    ]
    assert not bad, "\n".join(bad)
    # The package itself (its __version__, read by the exporter's metadata) is below every layer: it imports nothing.
    assert graph["speakerlab"] == set()


def test_no_import_cycles():
    graph = import_graph()
    cycles = sorted(m for m in graph if m in reachable(graph, m))
    assert not cycles, f"import cycles through: {cycles}"


def test_inference_imports_load_no_training_module():
    code = (
        "import speakerlab.inference.extract, speakerlab.inference.deploy.export, speakerlab.inference.cli, "
        "speakerlab.scoring.score, sys; print([m for m in sys.modules if m.startswith('speakerlab.train')])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_config_imports_no_implementation_module():
    """The config reads the front-end registry (its features section and rules), its sections' settings modules
    and the one writer of output files (save_config), nothing else: loading a config never loads torch."""
    graph = import_graph()
    sections = {"settings", "frontends", "objectives", "augment_settings", "hardware_settings", "outputs"}
    assert graph["speakerlab.config"] == {f"speakerlab.{m}" for m in sections}
    assert {layer(m) for m in reachable(graph, "speakerlab.config")} == sections
    assert graph["speakerlab.settings"] == set()
    code = "import speakerlab.config, sys; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


# Commands a recipe runs around training that read settings, lists, embeddings or scores only: each is a new
# interpreter per stage, and torch's import is 3-6 s of CPU in each (egs/custom runs speakerlab-scaled every stage 3).
TORCH_FREE_COMMANDS = (
    "speakerlab.train.scaled",
    "speakerlab.dataio.tables.prepare",
    "speakerlab.datasets.folder.cli",
    "speakerlab.scoring.score",
    "speakerlab.scoring.calibrate",
    "speakerlab.train.pseudo_label",
    "speakerlab.diarization.der",
)


def test_the_recipes_helper_commands_load_no_torch():
    code = (
        "import importlib, sys\n"
        f"for m in {TORCH_FREE_COMMANDS!r}:\n"
        "    importlib.import_module(m)\n"
        "    print(m, 'torch' in sys.modules)\n"
        "    if 'torch' in sys.modules: break"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == [w for m in TORCH_FREE_COMMANDS for w in (m, "False")], out


def test_the_front_end_settings_have_one_import_path():
    """FeatureSpec and the front ends' settings live in speakerlab.frontends, and everything (the package, the tests,
    bench/) imports them from there, never through a module that happens to import them too."""
    names = {"FeatureSpec", "FbankConfig", "ReDimNetMelConfig", "W2VBertFbankConfig", "WaveformConfig"}
    root = PACKAGE.parent
    bad = []
    for path in [*PACKAGE.rglob("*.py"), *(root / "tests").glob("*.py"), *(root / "bench").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("speakerlab"):
                if not node.module.startswith("speakerlab.frontends"):
                    bad += [f"{path.relative_to(root)}:{node.lineno} {a.name}" for a in node.names if a.name in names]
    assert not bad, "import these from speakerlab.frontends: " + ", ".join(bad)


def test_no_two_modules_share_a_name():
    """A module's name says what it is: two `cluster.py` (a Slurm plan and speaker clustering) read as one. Names of
    a role that a layer may have once (its commands, its registry, its settings, its shared helpers, its pipeline)
    are the exception."""
    roles = {"__init__", "__main__", "cli", "common", "pipeline", "registry", "settings"}
    seen: Dict[str, list] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.stem not in roles:
            seen.setdefault(path.stem, []).append(str(path.relative_to(PACKAGE)))
    twice = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not twice, twice


def room(module: str) -> str:
    """`speakerlab.dataio.tables.lists` -> `tables`; `speakerlab.dataio.audio` -> `audio`; the layer's package -> ``."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 else ""


def test_every_import_inside_a_layer_follows_its_rooms():
    graph = import_graph()
    unknown = sorted(m for m in graph if layer(m) in ROOMS and room(m) and room(m) not in ROOMS[layer(m)])
    assert not unknown, f"modules outside their layer's rooms: {unknown}"
    bad = [
        f"{m} ({room(m)}) imports {d} ({room(d)})"
        for m, deps in sorted(graph.items())
        if layer(m) in ROOMS and room(m)
        for d in sorted(deps)
        if layer(d) == layer(m) and room(d) and room(d) != room(m) and room(d) not in ROOMS[layer(m)][room(m)]
    ]
    assert not bad, "\n".join(bad)
