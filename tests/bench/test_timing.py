"""specswap.bench.timing: the interleaved timer calls every cell once a round, after its warm-up."""

import pytest

from specswap.bench.timing import interleaved_medians_ms, median_ms


def test_interleaved_medians_time_every_callable_round_robin():
    calls = []
    fns = {key: (lambda key=key: calls.append(key)) for key in ("a", ("b", 2), 3)}
    medians = interleaved_medians_ms(fns, repeats=4, warmup=2)
    assert set(medians) == set(fns) and all(m >= 0 for m in medians.values())
    assert calls[:6] == ["a", "a", ("b", 2), ("b", 2), 3, 3]  # each one's warm-up
    assert calls[6:] == ["a", ("b", 2), 3] * 4  # then one call of each per round


def test_timers_refuse_no_repeats():
    with pytest.raises(ValueError, match="repeats must be at least 1, got 0"):
        interleaved_medians_ms({"a": lambda: None}, repeats=0)
    with pytest.raises(ValueError, match="repeats must be at least 1, got 0"):
        median_ms(lambda: None, repeats=0)
