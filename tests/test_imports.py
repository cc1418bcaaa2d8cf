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
# `commands` (the one argparse parser of the console scripts) is a leaf every layer with a script may import.
LAYERS: Dict[str, Set[str]] = {
    "settings": set(),
    "config": {"settings"},
    "devices": set(),
    "commands": set(),
    "dataio": {"config", "settings", "devices", "commands"},
    "features": {"dataio", "config", "devices", "commands"},
    "models": set(),
    "checkpoint": {"features", "models"},
    "scoring": {"dataio", "commands"},
    "inference": {"checkpoint", "features", "models", "dataio", "scoring", "devices", "commands"},
    "train": {
        "config",
        "settings",
        "devices",
        "dataio",
        "features",
        "models",
        "checkpoint",
        "inference",
        "scoring",
        "commands",
    },
    "datasets": {"dataio", "commands"},
    "synth": {"dataio", "commands"},
}


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> str:
    """`speakerlab.dataio.lists` -> `dataio`; `speakerlab.config` -> `config`; the package itself -> ``."""
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
        if layer(m) and layer(d) != layer(m) and layer(d) not in LAYERS[layer(m)]
    ]
    assert not bad, "\n".join(bad)


def test_no_import_cycles():
    graph = import_graph()
    cycles = sorted(m for m in graph if m in reachable(graph, m))
    assert not cycles, f"import cycles through: {cycles}"


def test_inference_imports_load_no_training_module():
    code = (
        "import speakerlab.inference.extract, speakerlab.inference.export, speakerlab.inference.cli, "
        "speakerlab.scoring.score, sys; print([m for m in sys.modules if m.startswith('speakerlab.train')])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_config_imports_no_implementation_module():
    graph = import_graph()
    assert graph["speakerlab.config"] == {"speakerlab.settings"} and graph["speakerlab.settings"] == set()
