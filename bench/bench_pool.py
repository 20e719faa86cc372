"""Python-level cost of the state pool and the policy (google-benchmark).

    python bench/bench_pool.py --benchmark_min_time=0.2s
"""

import google_benchmark as benchmark

from specswap import AdaptiveConfig, AdaptiveSpeculativeParams, SpecRuntimeState, StatePool


def _pool():
    pool = StatePool()
    for k in (1, 3, 7):
        pool.register(SpecRuntimeState(k, k + 1, draft=object(), verify=object(), draft_extend=object()))
    pool.activate(3)
    return pool


@benchmark.register
def acquire(state):
    pool = _pool()
    while state:
        pool.acquire()


@benchmark.register
def acquire_and_read_runner(state):
    pool = _pool()
    while state:
        pool.acquire().verify


@benchmark.register
def activate_switch(state):
    pool = _pool()
    tiers = (1, 3)
    i = 0
    while state:
        pool.activate(tiers[i & 1])
        i += 1


@benchmark.register
def policy_update_batch8(state):
    params = AdaptiveSpeculativeParams(3, AdaptiveConfig(warmup_batches=0, update_interval=1))
    batch = [2] * 8
    while state:
        params.update(batch)


if __name__ == "__main__":
    benchmark.main()
