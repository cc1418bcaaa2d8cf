"""The package's import structure: no cycles, inference independent of training, a pure config module.

Imports are read from the source (module level and inside functions alike), so a cycle hidden in a
function-level import counts too.
"""

import ast
import subprocess
import sys
from pathlib import Path
from typing import Dict, Set

PACKAGE = Path(__file__).resolve().parent.parent / "speakerlab"
INFERENCE = [
    "speakerlab.extract",
    "speakerlab.export",
    "speakerlab.embedder",
    "speakerlab.embeddings",
    "speakerlab.score",
    "speakerlab.baseline",
    "speakerlab.cli",
    "speakerlab.resample",
]


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


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


def test_no_import_cycles():
    graph = import_graph()
    cycles = sorted(m for m in graph if m in reachable(graph, m))
    assert not cycles, f"import cycles through: {cycles}"


def test_inference_side_never_reaches_the_training_engine():
    graph = import_graph()
    for name in INFERENCE:
        bad = sorted(m for m in reachable(graph, name) if m.startswith("speakerlab.engine") or m == "speakerlab.train")
        assert not bad, f"{name} reaches {bad}"


def test_inference_imports_load_no_engine_module():
    code = (
        "import speakerlab.extract, speakerlab.export, speakerlab.cli, sys; "
        "print([m for m in sys.modules if m.startswith('speakerlab.engine')])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_config_imports_no_implementation_module():
    graph = import_graph()
    assert graph["speakerlab.config"] == {"speakerlab.settings"} and graph["speakerlab.settings"] == set()
