"""The C++ state pool seen from Python."""

import gc
import threading
import weakref

import pytest

import specswap
from specswap import SpecRuntimeState, StatePool


class Runner:
    def __init__(self, name):
        self.name = name


def state(steps, **stages):
    return SpecRuntimeState(steps, steps + 1, **stages)


def test_compiled_core_is_used():
    assert StatePool.__module__ == "specswap._C"
    assert specswap.AdaptiveSpeculativeParams.__module__ == "specswap._C"
    assert specswap._C.__file__.endswith(".so")


def test_state_carries_python_objects_and_is_immutable():
    draft, verify = Runner("draft"), Runner("verify")
    s = state(3, draft=draft, verify=verify)
    assert s.speculative_num_steps == 3
    assert s.speculative_num_draft_tokens == 4
    assert s.draft is draft and s.verify is verify and s.draft_extend is None
    with pytest.raises(AttributeError):
        s.speculative_num_steps = 7
    with pytest.raises(AttributeError):
        s.draft = Runner("other")


def test_state_rejects_bad_counts():
    with pytest.raises(ValueError, match="speculative_num_steps"):
        SpecRuntimeState(-1, 1)
    with pytest.raises(ValueError, match="speculative_num_draft_tokens"):
        SpecRuntimeState(1, 0)


def test_acquire_activate_and_report():
    pool = StatePool()
    assert pool.acquire() is None and pool.active_tier is None
    runners = {k: Runner(k) for k in (1, 3, 7)}
    for k in (7, 1, 3):
        pool.register(state(k, verify=runners[k]))
    assert pool.tiers() == [1, 3, 7]
    assert len(pool) == 3 and 3 in pool and 5 not in pool
    assert pool.activate(3) is True
    assert pool.acquire().verify is runners[3]
    assert pool.activate(3) is False  # already active: no switch
    assert pool.activate(7) is True
    assert pool.acquire().speculative_num_steps == 7
    assert pool.active_tier == 7
    assert pool.num_switches == 1
    stats = {row["speculative_num_steps"]: row for row in pool.stats()}
    assert stats[7]["active"] and not stats[3]["active"]
    assert stats[3]["activations"] == 1 and stats[1]["activations"] == 0
    assert stats[3]["seconds_active"] > 0 and stats[1]["seconds_active"] == 0


def test_unknown_tier_is_a_clear_error():
    pool = StatePool()
    pool.register(state(1))
    pool.register(state(3))
    with pytest.raises(ValueError, match=r"no state registered for tier 5; registered tiers: \[1, 3\]"):
        pool.activate(5)


def test_duplicate_registration_refused():
    pool = StatePool()
    pool.register(state(3))
    with pytest.raises(ValueError, match="already registered"):
        pool.register(state(3))


def test_register_after_start():
    pool = StatePool()
    pool.register(state(1))
    pool.activate(1)
    pool.register(state(5))
    assert pool.activate(5) is True


def test_state_outlives_pool_while_held():
    runner = Runner("verify")
    ref = weakref.ref(runner)
    pool = StatePool()
    pool.register(state(3, verify=runner))
    pool.activate(3)
    held = pool.acquire()
    del pool, runner
    gc.collect()
    assert ref() is not None and held.verify.name == "verify"
    del held
    gc.collect()
    assert ref() is None  # no leak once the last holder is gone


def test_threads_never_see_torn_state():
    pool = StatePool()
    for k in (1, 3, 7):
        pool.register(state(k, verify=("verify", k), draft=("draft", k)))
    pool.activate(1)
    torn = []
    stop = threading.Event()

    def reader():
        while not stop.is_set():
            s = pool.acquire()
            k = s.speculative_num_steps
            if s.speculative_num_draft_tokens != k + 1 or s.verify != ("verify", k) or s.draft != ("draft", k):
                torn.append(k)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for i in range(20000):
        pool.activate((1, 3, 7)[i % 3])
    stop.set()
    for t in threads:
        t.join()
    assert torn == []
    assert pool.num_switches == 20000 - 1
