"""The verify's cost per row count on this machine: measured once where the engine starts, cached on disk.

A verify of n rows (a chain of n - 1 drafts, a tree of n nodes) is one target forward of n new tokens. How much n
rows cost over one depends on the CPU (AVX-512 VNNI against AVX2 only), the weights and the thread count, so it
is measured: batch 1, a short KV prefix, then ``ROW_COUNTS`` new rows, each the median of a few round-robin
repeats after a warm-up, divided by the 1-row median. The table (``RowCosts``) feeds the goodput policy's prior for
tiers never timed (``AdaptiveController.set_row_costs``) and the ``"candidate_trees": "auto"`` shapes
(``auto_trees``).

The cache is one JSON file per key under ``$SPECSWAP_CACHE_DIR/row-costs/`` (default ``~/.cache/specswap``): the
key hashes what the costs depend on, the model's fingerprint (class, config, weights kind and dtype, its modules'
block formats), the CPU (model name and ``cpu_capability()``, ``SPECSWAP_CPU_CAPS`` included), torch's thread
count and torch's version. ``SPECSWAP_ROW_COSTS=off`` (or ``Engine(row_costs="off")``) skips it; a skip or a
failed measurement is one warning, and the policy keeps its ``cost_prior_slope`` prior.
"""

from __future__ import annotations

import dataclasses
import hashlib
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

__all__ = ["RowCosts", "ROW_COUNTS", "ENV", "measure_row_costs", "fingerprint", "machine", "cache_key",
           "cache_path", "load_row_costs", "check_request", "resolve_row_costs", "auto_trees", "AUTO_TREE_BOUND",
           "AUTO_TREE_MAX_NODES"]

ROW_COUNTS = (1, 2, 4, 6, 8)
PREFIX = 32            # tokens already in the KV cache when the rows are timed
ENV = "SPECSWAP_ROW_COSTS"
CACHE_ENV = "SPECSWAP_CACHE_DIR"
OFF = ("off", "0", "false", "no", "none")
FORMAT = 1             # bump when the measurement changes: older files are then measured again
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


def measure_row_costs(model: torch.nn.Module, rows: Sequence[int] = ROW_COUNTS, *, prefix: int = PREFIX,
                      min_repeats: int = 5, max_repeats: int = 25, warmup: int = 2,
                      budget_seconds: float = 1.0) -> dict[int, float]:
    """Seconds of one target forward per row count (batch 1, ``prefix`` tokens in the cache, ``rows`` new ones):
    the median over round-robin rounds (one forward of each count a round, so a burst of load falls on every
    count alike) after ``warmup`` untimed calls each: at least ``min_repeats`` rounds, more while under
    ``budget_seconds``, at most ``max_repeats``. Returns {rows: seconds}."""
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
        times: dict[int, list[float]] = {count: [] for count in rows}
        start = time.perf_counter()
        for round_ in range(max_repeats):
            if round_ >= min_repeats and time.perf_counter() - start > budget_seconds:
                break
            for count, call in calls.items():
                began = time.perf_counter()
                call()
                sync()
                times[count].append(time.perf_counter() - began)
    return {count: statistics.median(values) for count, values in times.items()}


def load_row_costs(model: torch.nn.Module, weights: str, *, measure: Callable[..., dict[int, float]] | None = None,
                   ) -> RowCosts:
    """The model's row costs on this machine: from the cache when its key matches, else measured now (one log
    line) and written there. ``measure`` replaces ``measure_row_costs`` (tests)."""
    key, described = cache_key(model, weights)
    path = cache_dir() / f"{key}.json"
    try:
        stored = json.loads(path.read_text())
        if stored.get("key") == described:
            costs = RowCosts({int(r): float(c) for r, c in stored["costs"].items()}, "cache", path)
            logger.info("specswap: verify cost per row count from the cache %s: %s", path, costs.describe())
            return costs
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        logger.warning("specswap: ignoring the unreadable row-cost cache %s (%s); measuring again", path, exc)
    began = time.perf_counter()
    seconds = (measure or measure_row_costs)(model)
    costs = RowCosts({r: s for r, s in seconds.items()}, "measured", path, time.perf_counter() - began)
    threads = torch.get_num_threads()
    logger.warning("specswap: measured the verify's cost per row count once (%s, %s weights, %d thread%s, %.1f s): "
                   "%s; cached in %s", type(model).__name__, weights, threads, "" if threads == 1 else "s",
                   costs.seconds, costs.describe(), path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {"key": described, "costs": {str(r): c for r, c in costs.costs.items()},
                  "seconds": {str(r): s for r, s in sorted(seconds.items())}}
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(record, indent=1, sort_keys=True))
        temporary.replace(path)  # atomic: a concurrent start reads the old file or the new one
    except OSError as exc:
        logger.warning("specswap: could not cache the row costs in %s (%s); they are measured again next start",
                       path, exc)
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
                      measure: Callable[..., dict[int, float]] | None = None) -> RowCosts | None:
    """The Engine's ``row_costs`` keyword to a table: "auto" (measured or cached; ``SPECSWAP_ROW_COSTS=off`` skips
    it), "off", or a mapping {rows: relative cost} given as is. None (with one warning saying why) when skipped
    or when the measurement failed: the policy then keeps its ``cost_prior_slope`` prior."""
    request = check_request(request)
    if isinstance(request, RowCosts):
        return request
    if request == "off":
        _warn_once("row costs off (row_costs='off'): the policy prices untimed tiers by cost_prior_slope and "
                   "'auto' trees fall back to the fixed shapes")
        return None
    if os.environ.get(ENV, "").strip().lower() in OFF:
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
