"""Adaptive config loading: every bad input raises ValueError naming the key and the valid range; the shipped
configs load."""

import json
from pathlib import Path

import pytest

from specswap import AdaptiveConfig, load_adaptive_config


def write(tmp_path, payload, name="adaptive.json"):
    path = tmp_path / name
    path.write_text(payload if isinstance(payload, str) else json.dumps(payload))
    return path


def test_full_file_round_trip(tmp_path):
    values = {
        "policy": "goodput",
        "candidate_steps": [1, 2, 4, 8],
        "candidate_trees": [[3, 2, 6]],
        "ema_alpha": 0.3,
        "update_interval": 2,
        "warmup_batches": 0,
        "down_hysteresis": -0.5,
        "up_hysteresis": 0.1,
        "snap_initial_steps": True,
        "min_gain": 0.1,
        "noise_margin": 1.5,
        "collapse_evidence": 3.5,
        "cost_prior_slope": 0.25,
        "probe_rounds": 0,
        "probe_interval": 20,
        "refresh_interval": 30,
        "blind_zero_margin": 0.05,
        "acceptance_model": "positional",
        "python_policy": "",
    }
    config = load_adaptive_config(write(tmp_path, values))
    assert config.to_dict() == values


def test_partial_file_keeps_defaults(tmp_path):
    config = load_adaptive_config(str(write(tmp_path, {"ema_alpha": 0.5})))
    assert config.ema_alpha == 0.5
    assert config.candidate_steps == [1, 3, 7]
    assert config.warmup_batches == 10


def test_none_dict_and_config_sources():
    assert load_adaptive_config(None).to_dict() == AdaptiveConfig().to_dict()
    assert load_adaptive_config({"update_interval": 3}).update_interval == 3
    config = AdaptiveConfig(ema_alpha=0.4)
    assert load_adaptive_config(config) is config


def test_integer_alpha_accepted():
    assert load_adaptive_config({"ema_alpha": 1}).ema_alpha == 1.0


@pytest.mark.parametrize(
    "values, key, valid",
    [
        ({"ema_alpa": 0.5}, "ema_alpa", "valid keys"),
        ({"ema_alpha": "0.5"}, "ema_alpha", r"\(0, 1\]"),
        ({"update_interval": "5"}, "update_interval", ">= 1"),
        ({"candidate_steps": "1,3,7"}, "candidate_steps", "list"),
        ({"candidate_steps": 3}, "candidate_steps", "list"),
        ({"ema_alpha": 0.0}, "ema_alpha", r"\(0, 1\]"),
        ({"ema_alpha": 1.5}, "ema_alpha", r"\(0, 1\]"),
        ({"ema_alpha": -0.1}, "ema_alpha", r"\(0, 1\]"),
        ({"candidate_steps": [3]}, "candidate_steps", "at least two"),
        ({"candidate_steps": [3, 3]}, "candidate_steps", "at least two"),
        ({"candidate_steps": []}, "candidate_steps", "at least two"),
        ({"candidate_steps": [1, -3]}, "candidate_steps", r"\[0, 64\]"),
        ({"candidate_steps": [1, 2.5]}, "candidate_steps", "integers"),
        ({"candidate_steps": [1, 3.0]}, "candidate_steps", "integers"),
        ({"candidate_steps": [1, True]}, "candidate_steps", "integers"),
        ({"candidate_steps": [1, 100]}, "candidate_steps", r"\[0, 64\]"),
        ({"update_interval": 0}, "update_interval", ">= 1"),
        ({"update_interval": 2.0}, "update_interval", ">= 1"),
        ({"warmup_batches": -1}, "warmup_batches", ">= 0"),
        ({"warmup_batches": True}, "warmup_batches", ">= 0"),
        ({"down_hysteresis": "low"}, "down_hysteresis", "finite"),
        ({"up_hysteresis": None}, "up_hysteresis", "finite"),
        ({"up_hysteresis": float("inf")}, "up_hysteresis", "finite"),
        ({"snap_initial_steps": "yes"}, "snap_initial_steps", "true or false"),
        ({"policy": "fastest"}, "policy", "'sglang', 'goodput'"),
        ({"policy": 1}, "policy", "'sglang', 'goodput'"),
        ({"policy": None}, "policy", "'sglang', 'goodput'"),
        ({"acceptance_model": "bursty"}, "acceptance_model", "'geometric', 'positional'"),
        ({"min_gain": -0.01}, "min_gain", ">= 0"),
        ({"min_gain": "3%"}, "min_gain", ">= 0"),
        ({"cost_prior_slope": -1}, "cost_prior_slope", ">= 0"),
        ({"probe_rounds": -1}, "probe_rounds", ">= 0"),
        ({"probe_rounds": 1.5}, "probe_rounds", ">= 0"),
        ({"probe_interval": 0}, "probe_interval", ">= 1"),
    ],
)
def test_bad_values_name_key_and_range(tmp_path, values, key, valid):
    path = write(tmp_path, values) if all(v != float("inf") for v in values.values()) else None
    for source in filter(None, [values, path]):
        with pytest.raises(ValueError, match=key) as info:
            load_adaptive_config(source)
        assert __import__("re").search(valid, str(info.value)), str(info.value)


def test_error_from_file_names_the_file(tmp_path):
    path = write(tmp_path, {"ema_alpha": 2})
    with pytest.raises(ValueError, match=str(path)):
        load_adaptive_config(path)


def test_unknown_key_suggests_the_close_one():
    with pytest.raises(ValueError, match="did you mean 'warmup_batches'"):
        load_adaptive_config({"warmup_batch": 3})


@pytest.mark.parametrize("payload", ["[1, 3, 7]", '"ema_alpha"', "3", "null"])
def test_top_level_must_be_object(tmp_path, payload):
    with pytest.raises(ValueError, match="top level must be a JSON object"):
        load_adaptive_config(write(tmp_path, payload))


def test_invalid_json_reports_position(tmp_path):
    with pytest.raises(ValueError, match="not valid JSON.*line 1"):
        load_adaptive_config(write(tmp_path, '{"ema_alpha": }'))


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.json"):
        load_adaptive_config(tmp_path / "nope.json")


def test_wrong_source_type():
    with pytest.raises(TypeError, match="path, a dict"):
        load_adaptive_config(42)


def test_config_constructor_validates():
    with pytest.raises(ValueError, match="ema_alpha"):
        AdaptiveConfig(ema_alpha=0.0)


def test_policy_default_and_choice():
    assert AdaptiveConfig().policy == "sglang"
    assert load_adaptive_config({"policy": "goodput"}).policy == "goodput"
    with pytest.raises(ValueError, match="policy must be one of"):
        AdaptiveConfig(policy="goodput2")  # the C++ check, for callers that skip the loader


def test_schema_is_the_config_table():
    from specswap._core import adaptive_config_schema
    from specswap.adaptive_config import VALID_KEYS

    schema = adaptive_config_schema()
    defaults = AdaptiveConfig().to_dict()
    assert [field["name"] for field in schema] == list(defaults) == list(VALID_KEYS)
    for field in schema:
        assert field["default"] == defaults[field["name"]] == getattr(AdaptiveConfig(), field["name"])
        assert field["doc"] and field["valid"]
    kinds = {field["name"]: field["kind"] for field in schema}
    assert kinds["policy"] == "choice" and kinds["candidate_steps"] == "steps" and kinds["ema_alpha"] == "number"
    by_name = {field["name"]: field for field in schema}
    assert by_name["policy"]["choices"] == ["sglang", "goodput", "python"]
    assert (by_name["ema_alpha"]["low"], by_name["ema_alpha"]["low_open"], by_name["ema_alpha"]["high"]) == (0, True, 1)
    # every keyword of the constructor is a field, and the C++ check says the schema's words
    for field in schema:
        if field["kind"] in ("integer", "number") and field["low"] > float("-inf"):
            with pytest.raises(ValueError, match=__import__("re").escape(field["valid"])):
                AdaptiveConfig(**{field["name"]: type(field["default"])(field["low"] - 1)})


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.json")),
                         ids=lambda p: p.name)
def test_shipped_configs_load_with_tier_zero_among_the_candidates(path):
    config = load_adaptive_config(path)
    assert config.policy == "goodput" and 0 in config.candidate_steps and config.probe_interval == 100
