"""Run a phased workload against an in-process engine or a running server and record what happened.

A run is a plain dict (JSON-ready):

    {"phases": [{"name", "temperature", "start_s", "end_s",
                 "requests": [{"latency_s", "tokens", "verify_rounds", "accepted_draft_tokens"}]}],
     "trace": [[t_s, tier, tokens_in_step, phase_index], ...]}

Times are seconds of the mode's own clock (the sum of its engine steps' wall times). A mode's phases run in
order on the same engine, so the adaptive controller carries its state from one phase into the next, as it
would in production; other modes' steps may run between two of its steps (see bench/cli.py).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from specswap.bench.workloads import Phase


class EngineRunner:
    """One mode's engine, run phase by phase. Times are the mode's own clock: the sum of its engine steps' wall
    times, so that modes can be interleaved step by step without other modes' time counting against them."""

    def __init__(self, engine, concurrency: int, max_new_tokens: int, seed: int = 0,
                 on_request_done: Callable[[], None] | None = None, ignore_eos: bool = False,
                 estimates: bool = False):
        self.engine, self.concurrency, self.max_new_tokens, self.seed = engine, concurrency, max_new_tokens, seed
        # each step, the adaptive policy's view of its chains: [t_s, tier, batch, phase, {k: [E(k), ms a round]}]
        self.estimates = [] if estimates and getattr(engine, "controller", None) is not None else None
        self.ignore_eos = ignore_eos  # every request runs to max_new_tokens: the modes then do equal work
        self.on_request_done = on_request_done
        self.run: dict[str, Any] = {"phases": [], "trace": []}
        if self.estimates is not None:
            self.run["estimates"] = self.estimates
        self.clock = 0.0
        self.request_index = 0

    def phase_steps(self, phase_index: int, phase: Phase) -> Iterator[None]:
        """Run ``phase`` one engine step per iteration, keeping ``concurrency`` requests in flight (continuous
        batching via add_request/step). Only the time inside an iteration (the requests added, the step) counts
        on the mode's clock, so the caller may run other modes' steps between two iterations. A multiturn
        phase's second turn joins the queue's front once its first turn finished (``Phase.second_turn``)."""
        engine = self.engine
        speculative = engine.speculative_algorithm is not None
        pending = deque(enumerate(phase.prompts))  # (index of a first turn, or None for a second turn, prompt)
        first_turns: dict[int, int] = {}  # request id -> its prompt's index in the phase
        started: dict[int, float] = {}  # request id -> the mode's clock when it was added
        seen_tokens: dict[int, int] = {}
        records = []
        phase_start = self.clock
        while pending or started:
            t0 = time.perf_counter()
            while pending and len(started) < self.concurrency:
                index, prompt = pending.popleft()
                request_id = engine.add_request(prompt, max_new_tokens=self.max_new_tokens,
                                                temperature=phase.temperature, seed=self.seed + self.request_index,
                                                ignore_eos=self.ignore_eos)
                if index is not None:
                    first_turns[request_id] = index
                self.request_index += 1
                started[request_id] = self.clock + time.perf_counter() - t0
                seen_tokens[request_id] = 0
            step = engine.step()
            now = self.clock + time.perf_counter() - t0
            tier = step.tier if speculative else 0
            step_tokens = 0
            for output in step.outputs:
                step_tokens += len(output.token_ids) - seen_tokens.get(output.request_id, 0)
                seen_tokens[output.request_id] = len(output.token_ids)
                if output.finished:
                    records.append({"latency_s": now - started.pop(output.request_id),
                                    "tokens": len(output.token_ids),
                                    "verify_rounds": output.num_verify_rounds,
                                    "accepted_draft_tokens": sum(output.accept_lengths)})
                    index = first_turns.pop(output.request_id, None)
                    if index is not None and phase.followups:
                        second = phase.second_turn(index, output.text)
                        if second is not None:
                            pending.appendleft((None, second))
                    if self.on_request_done is not None:
                        self.on_request_done()
            self.run["trace"].append([now, tier, step_tokens, phase_index])
            if self.estimates is not None:
                self._estimate(now, tier, len(step.outputs), phase_index)
            self.clock = now
            yield
        self.run["phases"].append({"name": phase.name, "temperature": phase.temperature, "start_s": phase_start,
                                   "end_s": self.clock, "requests": records})

    def _estimate(self, now: float, tier: int, batch: int, phase_index: int) -> None:
        """The policy's expected tokens and cost per round of each candidate chain after this step (outside the
        step's time)."""
        from specswap.tier import Tier

        params = self.engine.controller.params
        self.estimates.append([now, tier, batch, phase_index, {
            key: [round(params.model_tokens(key), 3), round(seconds * 1e3, 2)]
            for key, seconds in params.cost_estimates().items() if not Tier.from_key(key).is_tree}])

    def run_phase(self, phase_index: int, phase: Phase) -> None:
        """The whole of ``phase``, step after step."""
        for _ in self.phase_steps(phase_index, phase):
            pass


_DONE = object()  # what next() returns from a finished phase_steps iterator


def run_interleaved(steps: Iterable[Iterator[None]]) -> None:
    """Advance each iterator (``EngineRunner.phase_steps``) by one step in turn, in the order given, until every
    one is exhausted: the modes' engine steps interleaved one by one."""
    live = list(steps)
    while live:
        live = [step for step in live if next(step, _DONE) is not _DONE]


def _metric_value(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{}"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def run_server(url: str, phases: list[Phase], concurrency: int, max_new_tokens: int, seed: int = 0,
               api_key: str | None = None, model: str | None = None, poll_seconds: float = 0.1,
               timeout_s: float = 600.0, on_request_done: Callable[[], None] | None = None,
               ignore_eos: bool = False) -> dict[str, Any]:
    """The same workload over HTTP (``POST /v1/completions``, not streamed). The tier trace comes from polling
    ``/server_info``; accept lengths per phase from the ``spec_accept_length`` histogram in ``/metrics``."""
    import httpx

    base = url.rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    client = httpx.Client(base_url=base, headers=headers, timeout=timeout_s)
    if model is None:
        model = client.get("/v1/models").raise_for_status().json()["data"][0]["id"]
    run: dict[str, Any] = {"phases": [], "trace": []}
    t0 = time.perf_counter()
    phase_now = [0]
    stop_polling = threading.Event()

    def poll() -> None:
        last_tokens = None
        while not stop_polling.is_set():
            try:
                info = client.get("/server_info").json()
            except httpx.HTTPError:
                info = None
            if info is not None:
                tokens = info.get("generated_tokens", 0)
                delta = 0 if last_tokens is None else tokens - last_tokens
                last_tokens = tokens
                run["trace"].append([time.perf_counter() - t0, info.get("speculative_num_steps", 0), delta,
                                     phase_now[0]])
            stop_polling.wait(poll_seconds)

    def histogram() -> tuple[float, float]:
        text = client.get("/metrics").text
        return _metric_value(text, "spec_accept_length_sum"), _metric_value(text, "spec_accept_length_count")

    def one(prompt: str, temperature: float, request_seed: int) -> tuple[dict[str, Any], str]:
        start = time.perf_counter()
        response = client.post("/v1/completions", json={
            "model": model, "prompt": prompt, "max_tokens": max_new_tokens, "temperature": temperature,
            "seed": request_seed, "ignore_eos": ignore_eos})
        if response.status_code != 200:
            raise RuntimeError(f"{base}/v1/completions answered {response.status_code}: {response.text[:300]}")
        body = response.json()
        if on_request_done is not None:
            on_request_done()
        return {"latency_s": time.perf_counter() - start, "tokens": body["usage"]["completion_tokens"]}, \
            body["choices"][0]["text"]

    def turns(phase: Phase, index: int, request_seed: int) -> list[dict[str, Any]]:
        """The phase's request ``index``, then its second turn if it has one (multiturn)."""
        record, answer = one(phase.prompts[index], phase.temperature, request_seed)
        second = phase.second_turn(index, answer)
        if second is None:
            return [record]
        return [record, one(second, phase.temperature, request_seed + len(phase.prompts))[0]]

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    request_index = 0
    try:
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            for phase_index, phase in enumerate(phases):
                phase_now[0] = phase_index
                sum_before, count_before = histogram()
                phase_start = time.perf_counter() - t0
                futures = [pool.submit(turns, phase, i, seed + request_index + i) for i in range(len(phase.prompts))]
                request_index += phase.num_requests
                records = [record for future in futures for record in future.result()]
                phase_end = time.perf_counter() - t0
                sum_after, count_after = histogram()
                rounds = count_after - count_before
                # the histogram holds accepted + 1 per request-round: split it back into rounds and accepted drafts
                for record in records:
                    share = record["tokens"] / max(1, sum(r["tokens"] for r in records))
                    record["verify_rounds"] = rounds * share
                    record["accepted_draft_tokens"] = (sum_after - sum_before - rounds) * share
                run["phases"].append({"name": phase.name, "temperature": phase.temperature, "start_s": phase_start,
                                      "end_s": phase_end, "requests": records})
    finally:
        stop_polling.set()
        poller.join()
        client.close()
    return run

