"""The verify's cost per row count on this machine: measured once where the engine starts, cached on disk.

A verify of n rows (a chain of n - 1 drafts, a tree of n nodes) is one target forward of n new tokens. How much n
rows cost over one depends on the CPU (AVX-512 VNNI against AVX2 only), the weights and the thread count, so it
is measured: batch 1, a short KV prefix, then ``ROW_COUNTS`` new rows, each the median of round-robin repeats in
two passes after a warm-up, divided by the 1-row median. The table (``RowCosts``) feeds the goodput policy's prior
for tiers never timed (``AdaptiveController.set_row_costs``) and the ``"candidate_trees": "auto"`` shapes
(``auto_trees``); the policy's own timings of a tier replace it there.

A table measured under load misled every start that read it, so a measurement says when the machine was busy
(``Measurement.busy``: a count's repeats spread, or its two passes disagree), and a table is checked when
measured and when read from the cache (``check_costs``: 1 row is 1.0, no cost more than 5% below a smaller row
count's). A failing table is measured again, with one warning; a second failure is not cached and not used.

The cache is one JSON file per key under ``$SPECSWAP_CACHE_DIR/row-costs/`` (default ``~/.cache/specswap``): the
key hashes what the costs depend on, the model's fingerprint (class, config, weights kind and dtype, its modules'
block formats), the CPU (model name and ``cpu_capability()``, ``SPECSWAP_CPU_CAPS`` included), torch's thread
count and torch's version; it records when (UTC) and how (passes, repeats, spread) it was measured.
``SPECSWAP_ROW_COSTS=refresh`` measures again; ``off`` (or ``Engine(row_costs="off")``) skips it; a skip or a
failed measurement is one warning, and the policy keeps its ``cost_prior_slope`` prior.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import itertools
import json
import logging
import os
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from specswap._core import _C
from specswap.capability import OVERRIDE_ENV, cpu_capability
from specswap.huge_pages import on_huge_pages
from specswap.worker.layout import max_tree_nodes

logger = logging.getLogger(__name__)

__all__ = ["RowCosts", "ROW_COUNTS", "ENV", "Measurement", "measure_row_costs", "check_costs", "fingerprint",
           "machine", "cache_key",
           "cache_path", "load_row_costs", "check_request", "resolve_row_costs", "auto_trees", "AUTO_TREE_BOUND",
           "AUTO_TREE_MAX_NODES", "auto_steps", "round_cost", "DRAFT_COSTS", "AUTO_MAX_STEPS"]

ROW_COUNTS = (1, 2, 4, 6, 8)
PREFIX = 32            # tokens already in the KV cache when the rows are timed
ENV = "SPECSWAP_ROW_COSTS"
CACHE_ENV = "SPECSWAP_CACHE_DIR"
OFF = ("off", "0", "false", "no", "none")
REFRESH = "refresh"    # SPECSWAP_ROW_COSTS=refresh: measure again whatever the cache holds
FORMAT = 2             # bump when the measurement changes: older files are then measured again
PASSES = 2             # passes, one after the other: a load that came or went makes them disagree
SPREAD_LIMIT = 0.25    # busy: a row count's repeats in a pass spread (interquartile range / median) wider than this
PASS_LIMIT = 0.10      # busy: the passes' costs at a row count (over their 1-row cost) further apart than this
FALL_LIMIT = 0.05      # a bad table: a cost this far below a smaller row count's
_clock = time.perf_counter  # the measurement's timer (tests replace it)
# "candidate_trees": "auto": for each chain depth d >= 2, a tree of topk 2 whose node budget n (at most
# AUTO_TREE_MAX_NODES) costs at most AUTO_TREE_BOUND x the chain's verify (d + 1 rows): a tree must deliver that
# many more tokens per round than its chain to pay, and measured trees deliver about 1.05-1.3x (docs/trees.md).
AUTO_TREE_BOUND = 1.2
AUTO_TREE_MAX_NODES = 8
AUTO_TREE_TOPK = 2


@dataclasses.dataclass(frozen=True)
class RowCosts:
    """``costs``: row count -> a forward of that many new rows over one of a single row (1 among them, at 1.0).
    ``source``: "measured", "cache" or "given"; ``path``: the cache file (None when given). The table is the
    policy's own (``_core.RowCosts``): one check of it, one interpolation."""

    costs: dict[int, float]
    source: str
    path: Path | None = None
    seconds: float = 0.0   # the measurement's wall time (0 from the cache or given)

    def __post_init__(self):
        table = _C.RowCosts(self.costs)  # ValueError naming a bad table, TypeError for non-numbers
        object.__setattr__(self, "_table", table)
        object.__setattr__(self, "costs", table.costs)

    def at(self, rows: int) -> float:
        """The relative cost at ``rows``, as the C++ policy reads its table: linear between measured counts,
        beyond the last along the last segment (never falling)."""
        return self._table.at(rows)

    def describe(self) -> str:
        """``2 rows 1.07x, 4 rows 1.18x, ...``"""
        return ", ".join(f"{rows} rows {cost:.2f}x" for rows, cost in self.costs.items() if rows > 1)


# ---- the key ----------------------------------------------------------------------------------------------------


def _config_dict(config: Any) -> Any:
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    if hasattr(config, "to_dict"):
        return config.to_dict()
    return repr(config)


def fingerprint(model: torch.nn.Module, weights: str) -> dict[str, Any]:
    """What a model's forward cost depends on: its class, its config (hashed), the weights kind ("native",
    "bf16", "fp32"), its activation dtype, its modules by class and block format with its tensors' dtypes, and
    how many of its tensors are on huge pages (huge_pages: a one-token forward is faster there)."""
    config = json.dumps(_config_dict(getattr(model, "config", None)), sort_keys=True, default=str)
    modules = Counter(f"{type(m).__name__}:{getattr(m, 'block_type', '')}".rstrip(":") for m in model.modules())
    tensors = Counter(str(t.dtype).removeprefix("torch.") for t in (*model.parameters(), *model.buffers()))
    dtype = getattr(model, "dtype", None)
    return {"class": f"{type(model).__module__}.{type(model).__qualname__}",
            "config": hashlib.sha256(config.encode()).hexdigest()[:16],
            "weights": str(weights), "dtype": str(dtype).removeprefix("torch."),
            "modules": dict(sorted(modules.items())), "tensors": dict(sorted(tensors.items())),
            "huge_pages": sum(on_huge_pages(t) for t in (*model.parameters(), *model.buffers()))}


def machine() -> dict[str, Any]:
    """Where the costs were measured: the CPU (model and capability under SPECSWAP_CPU_CAPS), torch's threads and
    version."""
    capability = cpu_capability().as_dict()
    return {"cpu": capability["model"], "capability": capability["line"],
            "override": os.environ.get(OVERRIDE_ENV, "").strip(), "threads": torch.get_num_threads(),
            "torch": torch.__version__}


def cache_key(model: torch.nn.Module, weights: str) -> tuple[str, dict[str, Any]]:
    """(the cache file's key, what it hashes)."""
    described = {"format": FORMAT, "rows": list(ROW_COUNTS), "prefix": PREFIX, "model": fingerprint(model, weights),
                 "machine": machine()}
    text = json.dumps(described, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:24], described


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "specswap") / "row-costs"


def cache_path(model: torch.nn.Module, weights: str) -> Path:
    return cache_dir() / f"{cache_key(model, weights)[0]}.json"


# ---- the measurement --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Measurement:
    """One measurement: ``passes`` holds each pass's repeats, {rows: [seconds, ...]}."""

    passes: tuple[dict[int, list[float]], ...]

    @property
    def seconds(self) -> dict[int, float]:
        """{rows: the median over every pass's repeats}."""
        return {rows: statistics.median(t for one in self.passes for t in one[rows]) for rows in self.passes[0]}

    @property
    def repeats(self) -> list[int]:
        return [len(next(iter(one.values()))) for one in self.passes]

    @property
    def spread(self) -> float:
        """The widest interquartile range of a row count's repeats in a pass, over their median."""
        return max(_spread(values) for one in self.passes for values in one.values())

    @property
    def disagreement(self) -> float:
        """How far apart the passes put a row count's cost over their 1-row cost, at most (relative)."""
        tables = [_relative({rows: statistics.median(values) for rows, values in one.items()}) for one in self.passes]
        return max((abs(a[rows] - b[rows]) / min(a[rows], b[rows]) for i, a in enumerate(tables)
                    for b in tables[i + 1:] for rows in a), default=0.0)

    @property
    def busy(self) -> str | None:
        """Why the machine looked busy while measuring (None: it did not)."""
        if self.spread > SPREAD_LIMIT:
            return f"repeats spread {self.spread:.0%} (over {SPREAD_LIMIT:.0%})"
        if self.disagreement > PASS_LIMIT:
            return f"its {len(self.passes)} passes disagree by {self.disagreement:.0%} (over {PASS_LIMIT:.0%})"
        return None

    def describe(self) -> dict[str, Any]:
        """How it was measured, for the cache file."""
        return {"at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "passes": len(self.passes), "repeats": self.repeats, "spread": round(self.spread, 4),
                "disagreement": round(self.disagreement, 4),
                "seconds": {str(r): s for r, s in sorted(self.seconds.items())}}


def _spread(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    low, _, high = statistics.quantiles(values, n=4, method="inclusive")
    return (high - low) / statistics.median(values)


def _relative(seconds: Mapping[int, float]) -> dict[int, float]:
    return {rows: value / seconds[1] for rows, value in seconds.items()}


def check_costs(costs: Mapping[int, float]) -> str | None:
    """What is wrong with a table {rows: cost over one row} (None: nothing): 1 row must be 1.0 and no cost may
    fall more than ``FALL_LIMIT`` below a smaller row count's (a forward of more rows never costs less: such a
    table was measured while something else ran)."""
    if abs(costs.get(1, float("nan")) - 1.0) > 1e-9:
        return f"1 row costs {costs.get(1)}, not 1.0"
    highest = (1, 1.0)
    for rows in sorted(costs):
        if costs[rows] < (1.0 - FALL_LIMIT) * highest[1]:
            return (f"{rows} rows cost {costs[rows]:.2f}x, more than {FALL_LIMIT:.0%} below {highest[0]} rows' "
                    f"{highest[1]:.2f}x")
        if costs[rows] > highest[1]:
            highest = (rows, costs[rows])
    return None


def measure_row_costs(model: torch.nn.Module, rows: Sequence[int] = ROW_COUNTS, *, prefix: int = PREFIX,
                      min_repeats: int = 5, max_repeats: int = 25, warmup: int = 2, budget_seconds: float = 1.0,
                      passes: int = PASSES) -> Measurement:
    """Seconds of one target forward per row count (batch 1, ``prefix`` tokens in the cache, ``rows`` new ones),
    in ``passes`` passes one after the other, each of round-robin rounds (one forward of each count a round, so a
    burst of load falls on every count alike) after ``warmup`` untimed calls each: at least ``min_repeats``
    rounds, more while under its share of ``budget_seconds``, at most ``max_repeats``."""
    rows = sorted(set(int(r) for r in rows) | {1})
    device = model.device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    cache = model.make_cache(1, prefix + rows[-1])
    slots = torch.zeros(1, dtype=torch.long, device=device)
    token = min(100, model.config.vocab_size - 1)

    def forward(count: int) -> Callable[[], Any]:
        ids = torch.full((1, count), token, dtype=torch.long, device=device)
        positions = torch.arange(prefix, prefix + count, device=device)[None]
        return lambda: model(ids, positions, cache, slots, prefix + count)

    with torch.inference_mode():
        model(torch.full((1, prefix), token, dtype=torch.long, device=device),
              torch.arange(prefix, device=device)[None], cache, slots, prefix)
        calls = {count: forward(count) for count in rows}
        for call in calls.values():
            for _ in range(warmup):
                call()
        sync()
        return Measurement(tuple(_timed_pass(calls, sync, min_repeats, max_repeats, budget_seconds / passes)
                                 for _ in range(passes)))


def _timed_pass(calls: Mapping[int, Callable[[], Any]], sync: Callable[[], Any], min_repeats: int, max_repeats: int,
                budget_seconds: float) -> dict[int, list[float]]:
    times: dict[int, list[float]] = {count: [] for count in calls}
    start = _clock()
    for round_ in range(max_repeats):
        if round_ >= min_repeats and _clock() - start > budget_seconds:
            break
        for count, call in calls.items():
            began = _clock()
            call()
            sync()
            times[count].append(_clock() - began)
    return times


def load_row_costs(model: torch.nn.Module, weights: str, *, measure: Callable[..., Measurement] | None = None,
                   ) -> RowCosts:
    """The model's row costs on this machine: from the cache when its key matches and its table passes
    ``check_costs`` (``SPECSWAP_ROW_COSTS=refresh``: never), else measured now (one log line) and written there.
    A measurement that was busy or fails the check is made again, with one warning; RuntimeError if that one does
    too (not cached). ``measure`` replaces ``measure_row_costs`` (tests)."""
    key, described = cache_key(model, weights)
    path = cache_dir() / f"{key}.json"
    if os.environ.get(ENV, "").strip().lower() != REFRESH:
        cached = _read_cache(path, described)
        if cached is not None:
            return cached
    began = time.perf_counter()
    for attempt in (1, 2):
        measurement = (measure or measure_row_costs)(model)
        costs = RowCosts(measurement.seconds, "measured", path)
        problem = measurement.busy or check_costs(costs.costs)
        if problem is None:
            break
        if attempt == 2:
            raise RuntimeError(f"measured twice, refused twice (now: {problem}; {costs.describe()}); not cached")
        logger.warning("specswap: the row costs just measured are refused (%s; %s); measuring again", problem,
                       costs.describe())
    costs = dataclasses.replace(costs, seconds=time.perf_counter() - began)
    threads = torch.get_num_threads()
    logger.warning("specswap: measured the verify's cost per row count once (%s, %s weights, %d thread%s, %.1f s): "
                   "%s; cached in %s", type(model).__name__, weights, threads, "" if threads == 1 else "s",
                   costs.seconds, costs.describe(), path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {"key": described, "costs": {str(r): c for r, c in costs.costs.items()},
                  "measured": measurement.describe()}
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(record, indent=1, sort_keys=True))
        temporary.replace(path)  # atomic: a concurrent start reads the old file or the new one
    except OSError as exc:
        logger.warning("specswap: could not cache the row costs in %s (%s); they are measured again next start",
                       path, exc)
    return costs


def _read_cache(path: Path, described: Mapping[str, Any]) -> RowCosts | None:
    """The cached table if its key matches and it passes the check; None (a warning if it was there but unreadable
    or failing) otherwise."""
    try:
        stored = json.loads(path.read_text())
        if stored.get("key") != described:
            return None
        given = {int(r): float(c) for r, c in stored["costs"].items()}
        problem = check_costs(given)
        costs = RowCosts(given, "cache", path)
        when = str(stored.get("measured", {}).get("at"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        logger.warning("specswap: ignoring the unreadable row-cost cache %s (%s); measuring again", path, exc)
        return None
    if problem is not None:
        logger.warning("specswap: ignoring the row-cost cache %s (%s); measuring again", path, problem)
        return None
    logger.info("specswap: verify cost per row count from the cache %s (measured %s): %s", path, when,
                costs.describe())
    return costs


_warned: set[str] = set()


def _warn_once(reason: str) -> None:
    if reason not in _warned:
        _warned.add(reason)
        logger.warning("specswap: %s", reason)


def check_request(request: Any) -> RowCosts | str:
    """The Engine's ``row_costs`` keyword, checked before any weights load: a RowCosts for a mapping, else "auto"
    or "off". ValueError otherwise."""
    if isinstance(request, Mapping):
        try:
            return RowCosts({int(r): c for r, c in request.items()}, "given")
        except (TypeError, ValueError) as exc:
            raise ValueError(f"row_costs: {exc}") from None
    if isinstance(request, str) and request.lower() in ("auto", *OFF):
        return "auto" if request.lower() == "auto" else "off"
    raise ValueError(f"row_costs must be 'auto', 'off' or a mapping {{rows: relative cost}}; got {request!r}")


def resolve_row_costs(request: Any, model: torch.nn.Module, weights: str, *, distributed: bool = False,
                      measure: Callable[..., Measurement] | None = None) -> RowCosts | None:
    """The Engine's ``row_costs`` keyword to a table: "auto" (cached or measured; ``SPECSWAP_ROW_COSTS=off`` skips
    it, ``refresh`` measures again), "off", or a mapping {rows: relative cost} given as is. None (with one warning
    saying why) when skipped or when the measurement failed: the policy then keeps its ``cost_prior_slope`` prior."""
    request = check_request(request)
    if isinstance(request, RowCosts):
        return request
    if request == "off":
        _warn_once("row costs off (row_costs='off'): the policy prices untimed tiers by cost_prior_slope and "
                   "'auto' trees fall back to the fixed shapes")
        return None
    setting = os.environ.get(ENV, "").strip().lower()
    if setting not in ("", "auto", REFRESH, *OFF):
        raise ValueError(f"{ENV} must be 'auto', 'refresh' or 'off'; got {os.environ[ENV]!r}")
    if setting in OFF:
        _warn_once(f"row costs not measured ({ENV}={os.environ[ENV]}): the policy prices untimed tiers by "
                   "cost_prior_slope and 'auto' trees fall back to the fixed shapes")
        return None
    if distributed:
        _warn_once("row costs not measured under tp_size/dp_size > 1 (every rank must decide on one table; pass "
                   "row_costs={rows: cost}): the policy prices untimed tiers by cost_prior_slope")
        return None
    if model.device.type != "cpu":
        _warn_once(f"row costs are measured on the CPU only, the target is on {model.device}: the policy prices "
                   "untimed tiers by cost_prior_slope")
        return None
    try:
        return load_row_costs(model, weights, measure=measure)
    except Exception as exc:  # noqa: BLE001 - a failed measurement must not stop the engine; it is said once
        _warn_once(f"measuring the row costs failed ({type(exc).__name__}: {exc}): the policy prices untimed tiers "
                   "by cost_prior_slope and 'auto' trees fall back to the fixed shapes")
        return None


# ---- "candidate_trees": "auto" -----------------------------------------------------------------------------------


def auto_trees(costs: RowCosts | None, candidate_steps: Sequence[int], *, bound: float = AUTO_TREE_BOUND,
               max_nodes: int = AUTO_TREE_MAX_NODES) -> list[list[int]]:
    """The tree shapes ``"candidate_trees": "auto"`` stands for: for each chain depth d >= 2 among
    ``candidate_steps``, ``[d, 2, n]`` with the largest n in d + 2 .. ``max_nodes`` (and the shape's most
    nodes) whose verify costs at most ``bound`` x the chain's (``costs.at(n) <= bound * costs.at(d + 1)``); no
    tree at a depth where none fits. Without costs (skipped or failed): ``[d, 2, 2d]`` where that fits."""
    trees = []
    for depth in sorted({int(d) for d in candidate_steps if int(d) >= 2}):
        high = min(max_nodes, max_tree_nodes(depth, AUTO_TREE_TOPK))
        fits = [n for n in range(depth + 2, high + 1)
                if (costs.at(n) <= bound * costs.at(depth + 1) if costs is not None else n == 2 * depth)]
        if fits:
            trees.append([depth, AUTO_TREE_TOPK, max(fits)])
    return trees


# ---- "candidate_steps": "auto" (the default policy's tiers) ------------------------------------------------------

# What a drafting round costs beyond its verify, over one plain decode: (per round, per draft step). A model drafter
# (EAGLE, EAGLE-3, a draft model) from its measured static tiers at batch 1, one thread, greedy code, round cost
# less the verify's rows (results/eagle-code-xeon.json, eagle-humaneval-avx512-native.json, eagle-code-avx2-native
# .json: per-round 0.04-0.27 and per step 0.04-0.17); a lookup drafter (NGRAM, SUFFIX) drafts for next to nothing.
DRAFT_COSTS = {True: (0.10, 0.12), False: (0.02, 0.0)}
AUTO_MAX_STEPS = 7      # the deepest chain "auto" considers
AUTO_DRAFTING_TIERS = 3  # tier 1 and two more, as configs/goodput.json and goodput-eagle.json (and SGLang's 1/3/7)
# the acceptance "auto" must serve: geometric rates (a model drafter's, up to 0.9; a lookup's up to 0.95) and, for a
# lookup, bursts (a first draft accepted at p, then each next at q: a match runs on)
_RATES = {True: [i / 20 for i in range(2, 19)], False: [i / 20 for i in range(2, 20)]}
_BURSTS = [(p / 10, q) for p in range(1, 11) for q in (0.97, 1.0)]


def round_cost(costs: RowCosts, steps: int, model_drafter: bool) -> float:
    """A round at chain ``steps`` over a plain decode (1 row): the drafter's (``DRAFT_COSTS``) plus the verify's
    extra rows."""
    if steps == 0:
        return 1.0
    per_round, per_step = DRAFT_COSTS[bool(model_drafter)]
    return costs.at(steps + 1) + per_round + per_step * steps


def _tokens(steps: int, model_drafter: bool) -> list[float]:
    """Expected tokens a round at ``steps`` yields under each acceptance ``auto`` must serve."""
    out = [sum(rate ** i for i in range(steps + 1)) for rate in _RATES[bool(model_drafter)]]
    if not model_drafter:
        out += [1.0 + p * sum(q ** i for i in range(steps)) for p, q in _BURSTS]
    return out


def auto_steps(costs: RowCosts, model_drafter: bool, *, max_steps: int = AUTO_MAX_STEPS,
               drafting_tiers: int = AUTO_DRAFTING_TIERS) -> list[int]:
    """The chains ``"candidate_steps": "auto"`` (the default policy's) stands for on this machine: tier 0, tier 1
    and the ``drafting_tiers - 1`` deeper chains (up to ``max_steps``) whose best leaves the least goodput (expected
    tokens over ``round_cost``) below the best of every chain 0..max_steps, at the worst acceptance among those a
    drafter of this kind meets (loss rounded to 0.1%, ties to the shallower set). Without a table the config's
    fallback stands (``adaptive_config.DEFAULT_STEPS``)."""
    deeper = range(2, max_steps + 1)
    rates = [[tokens / round_cost(costs, k, model_drafter) for tokens in _tokens(k, model_drafter)]
             for k in range(max_steps + 1)]
    best = [max(column) for column in zip(*rates)]

    def loss(tiers: Sequence[int]) -> float:
        return round(max(1.0 - max(rates[k][i] for k in tiers) / top for i, top in enumerate(best)), 3)

    sets = [[0, 1, *extra] for extra in itertools.combinations(deeper, max(0, drafting_tiers - 1))]
    return min(sets, key=lambda tiers: (loss(tiers), tiers))
