"""Prometheus metrics for the server, on a registry of its own (several servers may live in one process).

Engine state (tier, EMA, switches, queue sizes) is read at scrape time from the scheduler's snapshot;
per-round accept lengths are observed by the scheduler thread as rounds complete.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from specswap.tier import Tier

ACCEPT_LENGTH_BUCKETS = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _EngineCollector:
    """Gauges and totals derived from the scheduler's stats snapshot (and the server's admission state)."""

    def __init__(self, scheduler, server):
        self.scheduler = scheduler
        self.server = server

    def collect(self):
        stats = self.scheduler.snapshot
        counters = self.scheduler.counters
        speculative = stats.get("speculative_algorithm") is not None
        shape = stats.get("tier", {}) if speculative else {}  # the active tier's shape (engine's Tier), not its key

        def gauge(name, documentation, value):
            family = GaugeMetricFamily(name, documentation)
            family.add_metric([], value)
            return family

        yield gauge("spec_num_steps", "Draft depth of the active tier (0: no speculation)",
                    shape.get("speculative_num_steps", 0))
        yield gauge("spec_eagle_topk", "Children per expanded node in the active tier (1: a chain)",
                    shape.get("speculative_eagle_topk", 1))
        yield gauge("spec_num_draft_tokens", "Tokens verified per request per round in the active tier, the root "
                    "included (a chain's steps + 1; 0 without speculation)",
                    shape.get("speculative_num_draft_tokens", 0))
        yield gauge("spec_adaptive_enabled", "1 when the adaptive controller picks the tier",
                    int(stats.get("adaptive", False)))
        yield gauge("spec_adaptive_ema", "The controller's EMA of accepted draft tokens per verify (NaN when static)",
                    float("nan") if stats.get("ema") is None else stats["ema"])
        switches = CounterMetricFamily("spec_tier_switches", "Tier switches made by the adaptive controller")
        switches.add_metric([], stats.get("num_switches", 0))
        yield switches
        if "switches_per_hour" in stats:  # distributed engines: switches agreed by every rank, bounded by the dwell
            yield gauge("spec_tier_switches_per_hour", "Tier switches per hour since start (distributed: agreed by "
                        "every rank)", stats["switches_per_hour"])
            yield gauge("spec_agreement_seconds", "Seconds spent in the per-step tier agreement (distributed)",
                        stats["agreement_seconds"])
        yield gauge("spec_num_requests_running", "Requests in the running batch", stats.get("running", 0))
        yield gauge("spec_num_requests_waiting", "Requests queued for a free slot",
                    stats.get("waiting", 0) + self.scheduler.pending())
        generated = CounterMetricFamily("spec_generation_tokens", "Tokens generated (finished and running requests)")
        generated.add_metric([], stats.get("generated_tokens", 0))
        yield generated
        prompt = CounterMetricFamily("spec_prompt_tokens", "Prompt tokens of admitted requests")
        prompt.add_metric([], counters.prompt_tokens)
        yield prompt
        finished = CounterMetricFamily("spec_requests_finished", "Finished requests by finish reason",
                                       labels=["finish_reason"])
        for reason, count in sorted(dict(counters.requests_finished).items()):
            finished.add_metric([reason], count)
        yield finished
        disabled = CounterMetricFamily("spec_requests_speculation_disabled", "Admitted requests that set "
                                       "disable_speculative_decoding (decoded at tier 0 inside the batch)")
        disabled.add_metric([], counters.speculation_disabled)
        yield disabled
        rejected = CounterMetricFamily("spec_requests_rejected", "Requests answered 503: the queue was full "
                                       "(queue_full) or the server was draining (draining)", labels=["reason"])
        for reason in ("queue_full", "draining"):
            rejected.add_metric([reason], self.server.rejected.get(reason, 0))
        yield rejected
        yield gauge("spec_server_draining", "1 once SIGTERM / SIGINT started the drain", int(self.server.draining))
        rounds = CounterMetricFamily("spec_verify_rounds", "Batched verify rounds per tier (a chain's steps, a "
                                     "tree's steps x topk x draft tokens)", labels=["num_steps"])
        for tier, count in sorted(stats.get("rounds_per_tier", {}).items()):
            rounds.add_metric([Tier.from_key(tier).label], count)
        yield rounds


class ServerMetrics:
    """The server's registry: the engine collector plus an accept-length histogram fed per request per round."""

    def __init__(self):
        self.registry = CollectorRegistry()
        self.accept_length = Histogram("spec_accept_length", "Tokens per verify per request, bonus included "
                                       "(accepted draft tokens + 1)", buckets=ACCEPT_LENGTH_BUCKETS,
                                       registry=self.registry)
        self.request_rounds = Counter("spec_request_verify_rounds", "Per-request verify rounds per tier",
                                      ["num_steps"], registry=self.registry)
        self.rejected: dict[str, int] = {}    # 503s by reason, counted on the event loop
        self.draining = False

    def attach(self, scheduler) -> None:
        self.registry.register(_EngineCollector(scheduler, self))

    def reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def on_round(self, accepted: int | None, tier: str) -> None:
        """Called by the scheduler thread for each request in each verify round, with the label of the tier it ran
        at (``Tier.label``); ``accepted`` None for a request with speculation disabled (its round counts under
        tier 0, its acceptance nowhere)."""
        if accepted is not None:
            self.accept_length.observe(accepted + 1)
        self.request_rounds.labels(tier).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
