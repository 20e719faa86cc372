"""The one loader of adaptive-policy settings: a JSON file, a dict or an AdaptiveConfig.

Nothing is silently ignored: an unknown key, a value of the wrong type or out of
range raises ValueError naming the key and what would be valid.

``"candidate_trees": "auto"`` asks for tree shapes chosen from the verify's
measured cost per row count (``worker.row_cost.auto_trees``), which exists only
once the Engine has loaded its target: ``read_adaptive_config`` reads such a
config (trees empty, the flag set) and ``with_candidate_trees`` fills them in;
``load_adaptive_config`` refuses "auto", naming the Engine.
"""

from __future__ import annotations

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
AUTO_TREES = "auto"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_value(key: str, value: Any, where: str) -> Any:
    kind, valid = _SCHEMA[key]
    if kind == "trees":
        valid += f", or {AUTO_TREES!r} (shapes from the measured row costs, chosen by the Engine)"
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


def _auto_trees_refused(where: str) -> ValueError:
    return ValueError(f"{where}candidate_trees {AUTO_TREES!r} is chosen by the Engine from the target's measured "
                      f"row costs: give this config to Engine(speculative_adaptive_config=...) (or specswap serve / "
                      f"bench), or list the trees")


def config_from_dict(values: Mapping[str, Any], *, where: str = "") -> AdaptiveConfig:
    """Build a validated AdaptiveConfig from a flat mapping of policy keys."""
    if isinstance(values, Mapping) and values.get("candidate_trees") == AUTO_TREES:
        raise _auto_trees_refused(where)
    return _from_dict(values, where)


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
        return AdaptiveConfig(**checked)
    except ValueError as exc:  # range errors from the C++ validator name the key
        raise ValueError(f"{where}{exc}") from None


def load_adaptive_config(source: ConfigSource = None) -> AdaptiveConfig:
    """Return a validated AdaptiveConfig from None (defaults), a dict, a JSON file or an AdaptiveConfig."""
    config, auto, where = _read(source)
    if auto:
        raise _auto_trees_refused(where)
    return config


def read_adaptive_config(source: ConfigSource = None) -> tuple[AdaptiveConfig, bool]:
    """``load_adaptive_config`` where ``"candidate_trees": "auto"`` is allowed: (the validated config, its trees
    empty when "auto", whether it said "auto"). "auto" needs the goodput policy, as any tree does."""
    config, auto, _ = _read(source)
    return config, auto


def with_candidate_trees(config: AdaptiveConfig, trees: Any) -> AdaptiveConfig:
    """``config`` with ``candidate_trees`` replaced by ``trees`` (validated)."""
    values = config.to_dict()
    values["candidate_trees"] = trees
    return _from_dict(values, "")


def _read(source: ConfigSource) -> tuple[AdaptiveConfig, bool, str]:
    if source is None or isinstance(source, AdaptiveConfig):
        return _load_object(source), False, ""
    values, where = (source, "") if isinstance(source, Mapping) else _read_file(source)
    if isinstance(values, Mapping) and values.get("candidate_trees") == AUTO_TREES:
        rest = {key: value for key, value in values.items() if key != "candidate_trees"}
        config = _from_dict(rest, where)
        if config.policy != "goodput":
            raise ValueError(f"{where}candidate_trees {AUTO_TREES!r} needs policy 'goodput' (SGLang's thresholds are "
                             f"per step count, not per tree), got policy {config.policy!r}")
        return config, True, where
    return _from_dict(values, where), False, where


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
