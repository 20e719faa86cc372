"""The server's control and observability routes: ``/health``, ``/health_generate``, ``/model_info`` (also
``/get_model_info``), ``/server_info`` (also ``/get_server_info``), ``/metrics``; and the SIGTERM drain. They read
the scheduler's snapshot and counters and the start-up ``ModelFacts``, never the engine."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response

from specswap.capability import cpu_capability
from specswap.sampling import SamplingParams
from specswap.server.limits import RETRY_AFTER_SECONDS
from specswap.server.metrics import CONTENT_TYPE
from specswap.server.state import ServerState
from specswap.tier import Tier

HEALTH_TIMEOUT = 20.0          # /health_generate: seconds the engine may take to show it is alive


def _shape(stats: dict[str, Any]) -> tuple[int, int, int]:
    """The active tier's shape (the engine's Tier), never its packed key; (0, 1, 0) without speculation."""
    if stats.get("speculative_algorithm") is None:
        return 0, 1, 0
    shape = stats["tier"]
    return shape["speculative_num_steps"], shape["speculative_eagle_topk"], shape["speculative_num_draft_tokens"]


def server_info_dict(state: ServerState) -> dict[str, Any]:
    """Tier, EMA, acceptance, switches and per-tier rounds, from the scheduler's snapshot."""
    scheduler, facts = state.scheduler, state.facts
    stats = dict(scheduler.snapshot)
    rounds = stats.get("num_verify_rounds", 0)
    steps, topk, tokens = _shape(stats)
    accept_length = stats["mean_accept_length"] + 1 if rounds else None
    info = {
        "model": facts.name,
        "speculative_algorithm": stats.get("speculative_algorithm"),
        "speculative_adaptive": stats.get("adaptive", False),
        "weights": stats.get("weights"),
        "speculative_num_steps": steps,
        "speculative_eagle_topk": topk,
        "speculative_num_draft_tokens": tokens,
        "candidate_steps": None,
        "ema": stats.get("ema"),
        "avg_spec_accept_length": accept_length,
        "mean_accepted_draft_tokens": stats["mean_accept_length"] if rounds else None,
        "num_switches": stats.get("num_switches", 0),
        "rounds_per_tier": {Tier.from_key(k).label: v for k, v in stats.get("rounds_per_tier", {}).items()},
        "num_verify_rounds": rounds,
        "generated_tokens": stats.get("generated_tokens", 0),
        "tokens_per_second": stats.get("tokens_per_second", 0.0),
        "num_requests_running": stats.get("running", 0),
        "num_requests_waiting": stats.get("waiting", 0) + scheduler.pending(),
        "requests_finished": dict(scheduler.counters.requests_finished),
        "max_batch_size": facts.max_batch_size,
        "max_seq_len": facts.max_seq_len,
        "uptime_s": time.time() - state.started,
        "server_args": state.server_args,
        # SGLang's per-scheduler state, where its clients read the live tier
        "internal_states": [{"speculative_num_steps": steps, "speculative_eagle_topk": topk,
                             "speculative_num_draft_tokens": tokens, "avg_spec_accept_length": accept_length,
                             "last_gen_throughput": stats.get("tokens_per_second", 0.0)}],
        "cpu": cpu_capability().as_dict(),  # what the dtype and kernel choices saw (docs/engine.md)
    }
    for key in ("suffix_global_tree", "hybrid"):  # SUFFIX's tree of recent outputs; the hybrid's choices
        if key in stats:
            info[key] = stats[key]
    if "tiers" in stats:  # the candidates, each with its shape (a row's "key" is the pool's)
        rows = [{**row, "key": row["speculative_num_steps"], **(tier := Tier.from_key(row["speculative_num_steps"]))
                 .as_dict(), "tier": tier.label} for row in stats["tiers"] if isinstance(row, dict)]
        info["candidate_steps"] = [row["tier"] if row["speculative_eagle_topk"] > 1 else row["speculative_num_steps"]
                                   for row in rows] or None
        info["tiers"] = rows
    return info


def _unhealthy(state: ServerState) -> JSONResponse | None:
    if state.metrics.draining:
        return JSONResponse({"status": "draining"}, status_code=503, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
    if not state.scheduler.alive:
        return JSONResponse({"status": "error", "error": repr(state.scheduler.error)}, status_code=503)
    return None


async def _generates(state: ServerState) -> JSONResponse | dict:
    """SGLang's deep health check: 200 once the engine has shown it generates (a running engine that went round
    its loop recently counts; an idle one decodes one token of a probe that no metric counts)."""
    scheduler = state.scheduler
    if scheduler.inflight and time.monotonic() - scheduler.last_loop < HEALTH_TIMEOUT:
        return {"status": "ok"}
    probe_ids = (state.facts.encode("") if state.facts.tokenizer is not None else []) or [0]
    updates = scheduler.submit(probe_ids, SamplingParams(max_new_tokens=1), reserved=False, counted=False)
    first = None

    async def finished():
        nonlocal first
        first = await updates.get()
        update = first
        while update.finish_reason is None and update.error is None:
            update = await updates.get()
        return update

    try:
        update = await asyncio.wait_for(finished(), HEALTH_TIMEOUT)
    except asyncio.TimeoutError:
        if first is not None and first.request_id is not None:
            scheduler.abort(first.request_id)
        return JSONResponse({"status": "error", "error": f"no token in {HEALTH_TIMEOUT:g} s"}, status_code=503)
    if update.error is not None:
        return JSONResponse({"status": "error", "error": update.error}, status_code=503)
    return {"status": "ok"}


def add_control_routes(app: FastAPI, state: ServerState) -> None:
    facts, limits, scheduler, metrics = state.facts, state.limits, state.scheduler, state.metrics

    @app.get("/health")
    async def health():
        return _unhealthy(state) or {"status": "ok"}

    @app.get("/health_generate")
    async def health_generate():
        return _unhealthy(state) or await _generates(state)

    @app.get("/get_model_info")
    @app.get("/model_info")
    async def model_info():
        path = state.server_args.get("model") or facts.name
        return {**facts.identity,  # what sglang-router reads
                "model_path": path, "tokenizer_path": path, "is_generation": True,
                "preferred_sampling_params": None, "weight_version": "default", "has_image_understanding": False,
                "has_audio_understanding": False, "served_model_name": facts.name, "max_seq_len": facts.max_seq_len}

    @app.get("/server_info")
    @app.get("/get_server_info")  # SGLang's older name, which its benchmark reads
    async def server_info():
        info = {**facts.identity, **server_info_dict(state)}
        info.update(max_running_requests=facts.max_batch_size, max_queued_requests=limits.max_queued_requests,
                    request_timeout=limits.request_timeout, max_prompts_per_request=limits.max_prompts_per_request,
                    max_prompt_chars=limits.max_prompt_chars, drain_timeout=limits.drain_timeout,
                    draining=metrics.draining, num_requests_admitted=scheduler.inflight,
                    requests_rejected=dict(metrics.rejected),
                    requests_speculation_disabled=scheduler.counters.speculation_disabled,
                    speculative_tiers=facts.tier_report)
        return info

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(metrics.render(), media_type=CONTENT_TYPE)


async def drain(state: ServerState, timeout: float | None = None) -> dict[str, Any]:
    """Stop admitting (new requests and /health answer 503), let every admitted request finish within ``timeout``
    seconds (default ``--drain-timeout``; a second signal's ``drain_state["cut"]`` ends the wait early), then abort
    the rest with finish reason "shutdown" and wait until each has its answer. Returns what happened."""
    scheduler, cut = state.scheduler, state.drain_state
    timeout = state.limits.drain_timeout if timeout is None else timeout
    state.metrics.draining = True
    began, admitted = time.monotonic(), scheduler.inflight
    print(f"specswap serve: draining: {admitted} request(s) admitted; new requests get 503 "
          f"(--drain-timeout {timeout:g} s)", flush=True)
    while scheduler.inflight and time.monotonic() - began < timeout and not cut["cut"]:
        await asyncio.sleep(0.02)
    aborted = scheduler.inflight
    if aborted:
        scheduler.abort_all("shutdown", f"the server shut down: the request did not finish within --drain-timeout "
                                        f"({timeout:g} s)")
        end = time.monotonic() + 10
        while scheduler.inflight and time.monotonic() < end:
            await asyncio.sleep(0.02)
    report = {"admitted": admitted, "aborted": aborted, "seconds": round(time.monotonic() - began, 3)}
    print(f"specswap serve: drained in {report['seconds']:.1f} s: {admitted - aborted} finished, {aborted} aborted "
          f"(finish reason 'shutdown')", flush=True)
    cut["report"] = report
    return report
