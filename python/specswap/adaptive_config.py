"""The one loader of adaptive-policy settings: a JSON file, a dict or an AdaptiveConfig.

Nothing is silently ignored: an unknown key, a value of the wrong type or out of
range raises ValueError naming the key and what would be valid; so does a key
only the goodput policy reads in a config that names no policy.

Which policy runs:

- no config (``Engine(speculative_adaptive=True)``, ``--speculative-adaptive``
  alone): the default, ``DEFAULT_POLICY`` for the drafter's kind (a model
  drafter: configs/goodput-eagle.json's keys; a lookup, NGRAM or SUFFIX:
  configs/goodput.json's), goodput with tier 0, its chains ``"auto"``;
- a config: what it says over the fields' defaults, which are SGLang's
  (``"policy": "sglang"``, tiers 1/3/7), so a config that names no policy is
  read as SGLang reads its file: the EMA thresholds.

``"auto"`` (``candidate_steps``, ``candidate_trees``) asks for tiers chosen
from the verify's measured cost per row count (``worker.row_cost.auto_steps``,
``auto_trees``), which exists only once the Engine has loaded its target:
``engine_adaptive_config`` reads such a config into an ``AdaptiveSetting`` and
its ``for_machine(row_costs)`` fills them in. ``read_adaptive_config`` reads
``"candidate_trees": "auto"`` (trees empty, the flag set) for
``with_candidate_trees``; ``load_adaptive_config`` refuses "auto", naming the
Engine.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
from typing import Any, Mapping, Union

from specswap._core import AdaptiveConfig, adaptive_config_schema

ConfigSource = Union[None, str, "os.PathLike[str]", Mapping[str, Any], AdaptiveConfig]

# key -> (kind, valid values in words), from the C++ field table (csrc/core/adaptive_config_fields.h): a field
# is added there, and this loader, the C++ checks and AdaptiveConfig's keywords all follow. Python checks the
# kind (JSON types: no bool for an integer, no string for a number); the C++ validator checks the range.
FIELDS: tuple[dict[str, Any], ...] = tuple(adaptive_config_schema())
_SCHEMA: dict[str, tuple[str, str]] = {field["name"]: (field["kind"], field["valid"]) for field in FIELDS}
_CHOICES: dict[str, tuple[str, ...]] = {
    field["name"]: tuple(field["choices"]) for field in FIELDS if field["kind"] == "choice"
}
POLICIES = _CHOICES["policy"]
ACCEPTANCE_MODELS = _CHOICES["acceptance_model"]
VALID_KEYS = tuple(_SCHEMA)
AUTO = "auto"
AUTO_TREES = AUTO
# the keys only the goodput policy reads (candidate_trees aside: the C++ check refuses trees under sglang)
GOODPUT_ONLY = tuple(field["name"] for field in FIELDS
                     if field["doc"].startswith("goodput only") and field["name"] != "candidate_trees")
# The default policy, by drafter kind (True: a model drafter, False: a lookup): the tuned configs' keys,
# configs/goodput-eagle.json and configs/goodput.json (tests/core/test_default_policy.py holds them equal), the
# chains chosen for the machine ("auto"); without a row-cost table their own (DEFAULT_STEPS).
_TUNED = {"policy": "goodput", "acceptance_model": "positional", "probe_interval": 100, "refresh_interval": 50,
          "blind_zero_margin": 0.25}
DEFAULT_POLICY: dict[bool, dict[str, Any]] = {
    True: {**_TUNED, "candidate_steps": AUTO},
    False: {**_TUNED, "candidate_steps": AUTO, "noise_margin": 1.0, "collapse_evidence": 4.6},
}
DEFAULT_STEPS: dict[bool, list[int]] = {True: [0, 1, 2, 3], False: [0, 1, 3, 7]}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_value(key: str, value: Any, where: str) -> Any:
    kind, valid = _SCHEMA[key]
    if kind in ("trees", "steps"):
        valid += f", or {AUTO!r} (from the measured row costs, chosen by the Engine)"
    bad = ValueError(f"{where}{key} must be {valid}, got {value!r} ({type(value).__name__})")
    if kind == "choice":
        if not isinstance(value, str) or value not in _CHOICES[key]:
            raise bad
        return value
    if kind == "steps":
        if not isinstance(value, (list, tuple)) or not all(_is_int(v) for v in value):
            raise bad
        return [int(v) for v in value]
    if kind == "trees":  # [[steps, topk, num_draft_tokens], ...]; the C++ validator checks each shape
        if not isinstance(value, (list, tuple)) or not all(
                isinstance(tree, (list, tuple)) and len(tree) == 3 and all(_is_int(v) for v in tree) for tree in value):
            raise bad
        return [[int(v) for v in tree] for tree in value]
    if kind == "text":
        if not isinstance(value, str):
            raise bad
        return value
    if kind == "integer":
        if not _is_int(value):
            raise bad
        return int(value)
    if kind == "number":
        if not (_is_int(value) or isinstance(value, float)) or not math.isfinite(value):
            raise bad
        return float(value)
    if not isinstance(value, bool):
        raise bad
    return value


def _auto_trees_refused(where: str, key: str = "candidate_trees") -> ValueError:
    return ValueError(f"{where}{key} {AUTO!r} is chosen by the Engine from the target's measured "
                      f"row costs: give this config to Engine(speculative_adaptive_config=...) (or specswap serve / "
                      f"bench), or list the {'trees' if key == 'candidate_trees' else 'tiers'}")


def config_from_dict(values: Mapping[str, Any], *, where: str = "") -> AdaptiveConfig:
    """Build a validated AdaptiveConfig from a flat mapping of policy keys."""
    for key in _auto_keys(values):
        raise _auto_trees_refused(where, key)
    return _from_dict(values, where)


def _auto_keys(values: Any) -> list[str]:
    return [key for key in ("candidate_steps", "candidate_trees")
            if isinstance(values, Mapping) and values.get(key) == AUTO]


def _from_dict(values: Mapping[str, Any], where: str) -> AdaptiveConfig:
    if not isinstance(values, Mapping):
        raise ValueError(
            f"{where}the adaptive config must be an object of policy keys, got {type(values).__name__}"
        )
    checked = {}
    for key, value in values.items():
        if key not in _SCHEMA:
            hint = difflib.get_close_matches(str(key), VALID_KEYS, n=1)
            suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise ValueError(
                f"{where}unknown adaptive config key {key!r}{suggestion}; valid keys: {', '.join(VALID_KEYS)}"
            )
        checked[key] = _check_value(key, value, where)
    try:
        config = AdaptiveConfig(**checked)
    except ValueError as exc:  # range errors from the C++ validator name the key
        raise ValueError(f"{where}{exc}") from None
    read_only_by_goodput = [key for key in checked if key in GOODPUT_ONLY]
    if "policy" not in checked and read_only_by_goodput:
        raise ValueError(f"{where}{', '.join(read_only_by_goodput)}: only the goodput policy reads "
                         f"{'it' if len(read_only_by_goodput) == 1 else 'them'}, and a config that names no policy "
                         f"runs SGLang's ('policy': 'sglang', its file format); add \"policy\": \"goodput\" (or "
                         f"\"sglang\" and drop {'it' if len(read_only_by_goodput) == 1 else 'them'})")
    return config


def load_adaptive_config(source: ConfigSource = None) -> AdaptiveConfig:
    """Return a validated AdaptiveConfig from None (the fields' defaults: SGLang's policy and tiers; the Engine's
    default policy is ``engine_adaptive_config``'s), a dict, a JSON file or an AdaptiveConfig."""
    config, auto, where = _read(source)
    for key in auto:
        raise _auto_trees_refused(where, key)
    return config


def read_adaptive_config(source: ConfigSource = None) -> tuple[AdaptiveConfig, bool]:
    """``load_adaptive_config`` where ``"candidate_trees": "auto"`` is allowed: (the validated config, its trees
    empty when "auto", whether it said "auto"). "auto" needs the goodput policy, as any tree does."""
    config, auto, where = _read(source)
    if "candidate_steps" in auto:
        raise _auto_trees_refused(where, "candidate_steps")
    return config, "candidate_trees" in auto


def with_candidate_trees(config: AdaptiveConfig, trees: Any) -> AdaptiveConfig:
    """``config`` with ``candidate_trees`` replaced by ``trees`` (validated)."""
    values = config.to_dict()
    values["candidate_trees"] = trees
    return _from_dict(values, "")


def _read(source: ConfigSource, model_drafter: bool | None = None) -> tuple[AdaptiveConfig, list[str], str]:
    """(the config, its keys that said "auto", where). "auto" chains stand as ``DEFAULT_STEPS`` of the drafter's kind
    (a lookup's when unknown) until ``AdaptiveSetting.for_machine``; "auto" trees as none."""
    if source is None or isinstance(source, AdaptiveConfig):
        return _load_object(source), [], ""
    values, where = (source, "") if isinstance(source, Mapping) else _read_file(source)
    auto = _auto_keys(values)
    if not auto:
        return _from_dict(values, where), [], where
    rest = {key: value for key, value in values.items() if key not in auto}
    if "candidate_steps" in auto:
        rest["candidate_steps"] = DEFAULT_STEPS[bool(model_drafter)]
    config = _from_dict(rest, where)
    if config.policy != "goodput":
        raise ValueError(f"{where}{' and '.join(auto)} {AUTO!r} needs policy 'goodput' (SGLang's thresholds are "
                         f"per step count, not priced by cost), got policy {config.policy!r}")
    return config, auto, where


@dataclasses.dataclass(frozen=True)
class AdaptiveSetting:
    """What an Engine's adaptive config asks for, read before its target loads (``engine_adaptive_config``):
    ``config`` validated, its "auto" chains standing as ``DEFAULT_STEPS`` and "auto" trees as none until
    ``for_machine`` fills them in from the row costs."""

    config: AdaptiveConfig
    steps_auto: bool
    trees_auto: bool
    model_drafter: bool
    default: bool  # no config was given: the default policy
    # a hybrid (a model drafter with SUFFIX beside it): "auto" chains are both kinds' (a suffix draft that runs on
    # pays at a lookup's deep tier, where its round, priced at the model's share of rounds, runs no model)
    hybrid: bool = False

    def for_machine(self, row_costs: Any) -> AdaptiveConfig:
        """The config with its "auto" chains (``worker.row_cost.auto_steps``) and trees (``auto_trees``) chosen
        from ``row_costs`` (a ``RowCosts``; None: the fallback tiers and shapes)."""
        if not (self.steps_auto or self.trees_auto):
            return self.config
        from specswap.worker.row_cost import auto_steps, auto_trees
        values = self.config.to_dict()
        if self.steps_auto:
            # without a table: the tuned configs' own tiers, priced by the policy's start-up probes
            kinds = {bool(self.model_drafter), False} if self.hybrid else {bool(self.model_drafter)}
            values["candidate_steps"] = sorted(set().union(*(
                DEFAULT_STEPS[kind] if row_costs is None else auto_steps(row_costs, kind) for kind in kinds)))
        if self.trees_auto:
            values["candidate_trees"] = auto_trees(row_costs, values["candidate_steps"])
        return _from_dict(values, "")

    def describe(self, config: AdaptiveConfig, row_costs: Any) -> str:
        """One line: which policy runs, over which tiers, and why."""
        what = "the default policy" if self.default else "the adaptive config"
        kind = "a model drafter" if self.model_drafter else "a lookup drafter"
        if self.hybrid:
            kind += " with SUFFIX beside it (both kinds' tiers)"
        tiers = list(config.candidate_steps) + [list(tree) for tree in config.candidate_trees]
        if not (self.steps_auto or self.trees_auto):
            return f"{what}: {config.policy}, tiers {tiers}"
        basis = ("chosen from the verify's row costs" if row_costs is not None else
                 "the tuned config's: no row costs; each tier priced by its own timings")
        return f"{what}: {config.policy} for {kind}, tiers {tiers} ({basis})"


def engine_adaptive_config(source: ConfigSource, *, model_drafter: bool, hybrid: bool = False) -> AdaptiveSetting:
    """The Engine's reading of ``speculative_adaptive_config``: None is the default policy (``DEFAULT_POLICY`` of
    the drafter's kind: a model drafter's, or a lookup's for NGRAM / SUFFIX; a hybrid's is its model drafter's,
    its "auto" chains both kinds'); a path, dict or AdaptiveConfig is read as ``load_adaptive_config`` reads it,
    "auto" allowed in ``candidate_steps`` and ``candidate_trees``."""
    default = source is None
    config, auto, _ = _read(DEFAULT_POLICY[bool(model_drafter)] if default else source, model_drafter)
    return AdaptiveSetting(config, "candidate_steps" in auto, "candidate_trees" in auto, bool(model_drafter),
                           default, hybrid)


def _load_object(source: Any) -> AdaptiveConfig:
    if source is None:
        return AdaptiveConfig()
    source.validate()
    return source


def _read_file(source: Any) -> tuple[dict[str, Any], str]:
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        where = f"{path}: "
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        except FileNotFoundError:
            raise FileNotFoundError(f"adaptive config file not found: {path}") from None
        try:
            values = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
        if not isinstance(values, dict):
            raise ValueError(
                f"{where}the top level must be a JSON object of policy keys, got {type(values).__name__}"
            )
        return values, where
    raise TypeError(
        f"adaptive config must be None, a path, a dict or an AdaptiveConfig, got {type(source).__name__}"
    )
