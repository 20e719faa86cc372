"""The house's limits (#58): no import circle among specswap's modules, Engine within 250 lines, no function in
python/specswap over 100 lines. Read from the source, not from a run."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "python" / "specswap"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, ast.Module]:
    return {module_name(path): ast.parse(path.read_text(), str(path)) for path in sorted(PACKAGE.rglob("*.py"))}


def imports(name: str, tree: ast.Module, known: set[str], is_package: bool) -> set[str]:
    """The specswap modules ``name`` imports anywhere in it (functions included): ``from a import b`` counts as
    a.b where that is a module, else a."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                target = f"{source}.{alias.name}"
                out.add(target if target in known else source)
    return {module for module in out if module in known and module != name}


def test_no_import_circle():
    trees = modules()
    known = set(trees)
    packages = {module_name(path) for path in PACKAGE.rglob("__init__.py")}
    # a package's __init__ re-exports its modules; an edge into it is the module it names, not a circle
    graph = {name: imports(name, tree, known, name in packages) - packages for name, tree in trees.items()}
    state: dict[str, int] = {}
    circles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                circles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    assert not circles, circles


def test_engine_and_functions_stay_small():
    engine = next(node for node in ast.parse((PACKAGE / "engine.py").read_text()).body
                  if isinstance(node, ast.ClassDef) and node.name == "Engine")
    assert engine.end_lineno - engine.lineno + 1 <= 250
    long = [f"{path.relative_to(PACKAGE)}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path in sorted(PACKAGE.rglob("*.py")) for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 100]
    assert not long, long
