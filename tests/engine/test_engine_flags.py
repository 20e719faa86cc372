"""One table for the Engine's keywords and the CLI's flags: every ``EngineOptions`` field is a flag (its names,
help, type and default declared in the field's metadata, ``specswap serve`` and ``bench`` generating theirs from
it) or marked engine-only; a flag's default is the field's unless the table gives a command its own; flags read
back into Engine keywords through the same table."""

import argparse
import dataclasses

import pytest

from specswap.cli import build_parser
from specswap.cli_flags import COMMANDS, engine_flags, engine_keywords
from specswap.engine_builder import EngineOptions, Flag

FIELDS = dataclasses.fields(EngineOptions)
# the commands whose default is not the Engine's, each said in the table: serve speculates only when asked, bench
# drafts with what the model has (EAGLE with a head, else NGRAM)
CLI_DEFAULTS = {("speculative_algorithm", "serve"): "NONE", ("speculative_algorithm", "bench"): None}


def parser_of(command: str) -> argparse.ArgumentParser:
    subparsers = next(action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction))
    return subparsers.choices[command]


def test_every_field_is_a_flag_or_marked_engine_only():
    for option in FIELDS:
        kinds = [kind for kind in ("flag", "engine_only") if kind in option.metadata]
        assert len(kinds) == 1, f"{option.name}: give it a flag(...) or engine_only(...) in its metadata"
        if kinds == ["flag"]:
            spec = option.metadata["flag"]
            assert isinstance(spec, Flag) and spec.help and spec.names and set(spec.commands) <= set(COMMANDS)
            assert all(name.startswith("--") for name in spec.names), option.name
        else:
            assert option.metadata["engine_only"], option.name  # it says why no flag sets it
    assert {option.name for option in FIELDS if "engine_only" in option.metadata} == {
        "tokenizer", "round_graphs", "ngram_numbers", "row_costs"}


def test_cli_specific_defaults_are_the_table_s_few():
    found = {(option.name, command): default for option in FIELDS if "flag" in option.metadata
             for command, (default, _) in option.metadata["flag"].cli_defaults.items()}
    assert found == CLI_DEFAULTS


@pytest.mark.parametrize("command", COMMANDS)
def test_the_parser_s_engine_flags_are_the_table_s(command):
    parser = parser_of(command)
    by_flag = {name: action for action in parser._actions for name in action.option_strings}
    generated = set()
    for option, spec in engine_flags(command):
        action = by_flag[spec.names[0]]
        generated.add(id(action))
        assert action.option_strings == list(spec.names) and action.dest == spec.dest
        expected = CLI_DEFAULTS.get((option.name, command), option.default)
        assert action.default == expected, f"{spec.names[0]}: {action.default!r}, the table's {expected!r}"
        assert action.help.startswith(spec.help)
    # no flag beside the generated ones sets an Engine keyword by hand
    names = {option.name for option in FIELDS}
    assert [action.dest for action in parser._actions if id(action) not in generated and action.dest in names] == []
    serve_only = {option.name for option, spec in engine_flags("serve")} - {o.name for o, _ in engine_flags("bench")}
    assert serve_only == {"speculative_adaptive", "disable_graphs", "tp_size", "tp_draft", "dp_size",
                          "dist_timeout", "min_dwell_rounds"}


@pytest.mark.parametrize("command", COMMANDS)
def test_defaults_read_back_as_the_engine_s_keywords(command):
    args = parser_of(command).parse_args([])
    keywords = {**engine_keywords(args, command), **engine_keywords(args, command, load=True)}
    assert set(keywords) == {option.name for option, _ in engine_flags(command)}
    for option in FIELDS:
        if option.name in keywords:
            assert keywords[option.name] == CLI_DEFAULTS.get((option.name, command), option.default), option.name
    assert set(engine_keywords(args, command, load=True)) == {"dtype", "weights", "draft_quantization", "device"}
    EngineOptions(**{**keywords, "speculative_algorithm": keywords["speculative_algorithm"] or "NGRAM"})


def test_flags_read_back_under_the_engine_s_names():
    args = parser_of("serve").parse_args([
        "--speculative-algorithm", "eagle", "--speculative-num-steps", "5", "--disable-cuda-graph",
        "--speculative-hybrid-drafter", "suffix", "--max-batch-size", "3", "--dtype", "float32",
        "--suffix-decoding-max-spec-factor", "1.5", "--min-dwell-rounds", "4", "--tp-draft", "shard"])
    keywords = engine_keywords(args, "serve")
    assert {key: keywords[key] for key in ("speculative_algorithm", "speculative_num_steps", "disable_graphs",
                                           "hybrid_drafter", "max_batch_size", "suffix_decoding_max_spec_factor",
                                           "min_dwell_rounds", "tp_draft")} == {
        "speculative_algorithm": "EAGLE", "speculative_num_steps": 5, "disable_graphs": True,
        "hybrid_drafter": "SUFFIX", "max_batch_size": 3, "suffix_decoding_max_spec_factor": 1.5,
        "min_dwell_rounds": 4, "tp_draft": "shard"}
    assert "dtype" not in keywords and engine_keywords(args, "serve", load=True)["dtype"] == "float32"
    with pytest.raises(ValueError, match="command must be one of serve, bench"):
        engine_flags("demo")
