"""The bench/ scripts as modules, for the tests that drive them (they are scripts, not a package)."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load_script(name: str) -> ModuleType:
    """bench/<name>.py imported as module ``name`` (registered in sys.modules: dataclasses look their module up),
    with bench/ on sys.path as when the script runs (its imports of the scripts beside it)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
