"""The model layer's imports, read from its source: no module imports another that (directly or through others)
imports it back, function-level imports included, and none imports another's private names. The loaders share
``weights_io`` instead."""

from __future__ import annotations

import ast
from pathlib import Path

MODELS = Path(__file__).resolve().parents[2] / "python" / "specswap" / "models"


def sibling_imports(package: Path) -> dict[str, list[tuple[str, str]]]:
    """module -> [(imported sibling module, imported name)] for every import of a sibling, at any depth."""
    modules = {path.stem for path in package.glob("*.py")}
    found: dict[str, list[tuple[str, str]]] = {}
    for path in sorted(package.glob("*.py")):
        edges = found.setdefault(path.stem, [])
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if node.level == 1 and module in modules:
                    edges.extend((module, alias.name) for alias in node.names)
                elif node.level == 1 and not module:  # from . import x
                    edges.extend((alias.name, "") for alias in node.names if alias.name in modules)
                elif module.startswith(f"specswap.{package.name}.") and module.rsplit(".", 1)[1] in modules:
                    edges.extend((module.rsplit(".", 1)[1], alias.name) for alias in node.names)
    return found


def cycles(graph: dict[str, list[tuple[str, str]]]) -> list[list[str]]:
    """Every import circle, as the path that closes it."""
    found, done = [], set()

    def visit(node, path):
        if node in path:
            found.append(path[path.index(node):] + [node])
            return
        if node in done:
            return
        for target, _ in graph.get(node, []):
            visit(target, path + [node])
        done.add(node)

    for node in sorted(graph):
        if node != "__init__":
            visit(node, [])
    return found


def private_imports(graph: dict[str, list[tuple[str, str]]]) -> list[str]:
    return [f"{module} imports {target}.{name}" for module, edges in graph.items() for target, name in edges
            if name.startswith("_")]


def test_the_model_layer_has_no_import_circle_and_no_private_cross_import():
    graph = sibling_imports(MODELS)
    graph.pop("__init__", None)  # the package's re-exports import everything and nothing imports them
    assert "weights_io" in graph and not cycles(graph)
    assert not private_imports(graph)


def test_the_scan_finds_a_function_level_circle_and_a_private_import(tmp_path):
    package = tmp_path / "models"
    package.mkdir()
    (package / "checkpoint.py").write_text("def load():\n    from .eagle3 import load_head\n")
    (package / "eagle3.py").write_text("def load_head():\n    from .checkpoint import _assign\n")
    (package / "layers.py").write_text("from .eagle3 import load_head\n")
    graph = sibling_imports(package)
    assert cycles(graph) == [["checkpoint", "eagle3", "checkpoint"]]
    assert private_imports(graph) == ["eagle3 imports checkpoint._assign"]
