"""bench/bench_ab.py's bookkeeping: the A/B order alternates, and the forward rows are each side's medians, their
ratios to one token and B over A (the children are faked: they are whole processes of either checkout)."""

from pathlib import Path
from types import SimpleNamespace

import pytest
from scripts import load_script


@pytest.fixture()
def bench_ab():
    return load_script("bench_ab")


def test_sides_alternate_so_drift_hits_both(bench_ab):
    order = []
    runs = bench_ab.alternating(4, lambda side: order.append(side) or len(order))
    assert order == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert runs == {"a": [1, 4, 5, 8], "b": [2, 3, 6, 7]}


def test_forward_rows_are_medians_with_ratios(bench_ab, monkeypatch):
    times = {"a": iter([{"1": 10.0, "4": 15.0}, {"1": 12.0, "4": 18.0}, {"1": 11.0, "4": 16.0}]),
             "b": iter([{"1": 10.0, "4": 12.0}, {"1": 9.0, "4": 13.0}, {"1": 11.0, "4": 14.0}])}
    calls = []

    def child(checkout, arguments, what, prompts, extra_env):
        calls.append((arguments, extra_env))
        return next(times[checkout.name])

    monkeypatch.setattr(bench_ab, "_child", child)
    args = SimpleNamespace(a=Path("/x/a"), b=Path("/x/b"), repeats=3, forward_repeats=7,
                           a_env=["SPECSWAP_HUGE_PAGES=off", "X=1=2"], b_env=[])
    rows = bench_ab.forward_rows(args, [1, 4])
    assert calls[0] == (["--child-forward", "1,4", "--forward-repeats", "7"], {"SPECSWAP_HUGE_PAGES": "off", "X": "1=2"})
    assert calls[1][1] == {}
    one, four = rows
    assert (one["a_forward_ms"], one["b_forward_ms"], one["b_over_a"]) == (11.0, 10.0, round(10 / 11, 3))
    assert (four["a_forward_ms"], four["b_forward_ms"]) == (16.0, 13.0)
    assert (four["a_ratio_to_one"], four["b_ratio_to_one"]) == (round(16 / 11, 3), 1.3)
    assert four["a_runs_ms"] == [15.0, 18.0, 16.0]


def test_forward_lengths_are_parsed_once_for_both_scripts():
    parse = load_script("bench_gemma_forward").parse_lengths
    assert parse("8,2,2") == [1, 2, 8] and parse("") == [1]
    for bad in ("x", "0,2", "2,-4"):
        with pytest.raises(ValueError, match="comma-separated positive integers"):
            parse(bad)
