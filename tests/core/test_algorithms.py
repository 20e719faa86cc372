"""specswap.algorithms: the one place that knows the speculative algorithms by name, and nothing else compares
their names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from specswap import algorithms
from specswap.algorithms import ALGORITHMS, NAMES, algorithm
from specswap.worker.drafter import Drafter

REPOSITORY = Path(__file__).resolve().parents[2]
SCANNED = [REPOSITORY / "python" / "specswap", REPOSITORY / "bench", REPOSITORY / "tools"]
REGISTRY = Path(algorithms.__file__).name  # the registry itself, python/specswap/algorithms.py


def test_every_algorithm_names_what_its_drafter_needs():
    assert NAMES == ("EAGLE", "EAGLE3", "STANDALONE", "NGRAM", "SUFFIX", "NONE")
    assert algorithm("EAGLE").needs_draft and algorithm("EAGLE").quantizable_draft
    assert algorithm("EAGLE3").draft_suffix == "eagle3" and algorithm("EAGLE3").quantizable_draft
    assert algorithm("STANDALONE").draft_suffix == "draft" and not algorithm("STANDALONE").quantizable_draft
    assert algorithm("NGRAM").number_tokens and not algorithm("NGRAM").needs_draft
    assert not algorithm("SUFFIX").needs_draft and algorithm("SUFFIX").tp_draft(None) == "leader"
    assert algorithm(None) is algorithm("NONE") and algorithm(None).name is None
    for entry in ALGORITHMS.values():
        assert issubclass(entry.drafter_class(), Drafter)


def test_an_unknown_name_lists_the_valid_ones():
    with pytest.raises(ValueError, match="'MEDUSA' is not supported; valid: EAGLE, EAGLE3, STANDALONE, NGRAM, SUFFIX, NONE"):
        algorithm("MEDUSA")
    with pytest.raises(ValueError, match="'eagle'"):
        algorithm("eagle")  # names are exact, as SGLang's


def test_a_drafter_s_options_are_its_algorithm_s_alone():
    """SUFFIX's keywords reach its drafter (None: its default, left out); another algorithm refuses them."""
    assert algorithm("SUFFIX").drafter_options(suffix_decoding_max_tree_depth=8, suffix_decoding_min_token_prob=None) \
        == {"suffix_decoding_max_tree_depth": 8}
    assert algorithm("EAGLE").drafter_options(suffix_decoding_max_tree_depth=None) == {}
    with pytest.raises(ValueError, match="suffix_decoding_max_tree_depth apply to speculative_algorithm SUFFIX; got "
                                         "NONE"):
        algorithm(None).drafter_options(suffix_decoding_max_tree_depth=8)


def comparisons_of_algorithm_names(roots) -> list[str]:
    names = {name for name in NAMES}
    found = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            if path.relative_to(root).as_posix() == REGISTRY:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Compare):
                    continue
                operands = [node.left, *node.comparators]
                constants = {n.value for n in operands if isinstance(n, ast.Constant)}
                constants |= {e.value for n in operands if isinstance(n, (ast.Tuple, ast.List, ast.Set))
                              for e in n.elts if isinstance(e, ast.Constant)}
                if constants & names:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_nothing_outside_the_registry_compares_algorithm_names():
    assert not comparisons_of_algorithm_names(SCANNED)


def test_the_scan_finds_a_comparison(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "engine.py").write_text('def f(a):\n    return a == "NGRAM" or a in ("EAGLE", "X")\n')
    assert len(comparisons_of_algorithm_names([tmp_path / "pkg"])) == 2
