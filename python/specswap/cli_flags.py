"""The model flags of ``specswap serve`` and ``specswap bench``, and engines built from what they load.

Both commands take SGLang-style flags (``--model``, ``--draft-model``, ``--speculative-algorithm``, ``--dtype``,
``--weights``, ...). The Engine's are generated from one table, ``engine_builder.EngineOptions`` (each field's
``flag``: names, help, type, which commands, a command's own default), and read back into Engine keywords through
the same table (``engine_keywords``); ``--model``, ``--draft-model`` and ``--threads`` are the CLI's own.
``specswap.loading.load_models`` turns the flags into built modules once, and ``build_engine`` wraps those in an
``Engine`` (several engines may share one copy of the weights).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from specswap.algorithms import NAMES, algorithm
from specswap.engine_builder import EngineOptions, Flag
from specswap.loading import LoadedModels

__all__ = ["ALGORITHM_CHOICES", "DEFAULT_MODEL", "add_engine_flags", "add_model_arguments", "build_engine",
           "check_speculative_flags", "engine_flags", "engine_keywords", "suffix_options"]

DEFAULT_MODEL = "gemma-3-270m"
ALGORITHM_CHOICES = NAMES
COMMANDS = ("serve", "bench")


def add_model_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """``command``'s ("serve" or "bench") model flags, spelled as SGLang spells them: the CLI's own and the
    Engine's (``add_engine_flags``)."""
    parser.add_argument("--model", "--model-path", dest="model", default=DEFAULT_MODEL,
                        help=f"zoo or registry name ('tiny', 'gemma-3-270m', 'smollm2-135m'), a Hugging Face "
                             f"checkpoint directory or a .gguf file (default {DEFAULT_MODEL})")
    parser.add_argument("--draft-model", "--speculative-draft-model-path", dest="draft_model", default=None,
                        help="draft checkpoint (EAGLE head, EAGLE-3 head directory as SpecForge saves it, or "
                             "standalone model); zoo models default to <model>-eagle / <model>-draft")
    add_engine_flags(parser, command)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: torch's choice; 1 avoids oversubscription on a shared "
                             "machine)")


def engine_flags(command: str) -> list[tuple[dataclasses.Field, Flag]]:
    """Each ``EngineOptions`` field ``command`` takes as a flag, with its ``Flag``, in the table's order."""
    if command not in COMMANDS:
        raise ValueError(f"command must be one of {', '.join(COMMANDS)}; got {command!r}")
    return [(option, option.metadata["flag"]) for option in dataclasses.fields(EngineOptions)
            if "flag" in option.metadata and command in option.metadata["flag"].commands]


def add_engine_flags(parser: argparse.ArgumentParser, command: str) -> None:
    """The Engine's flags ``command`` takes, as the table declares them: names, help, type / choices / action, and
    the field's default unless the table gives ``command`` its own (then with its help note)."""
    for option, spec in engine_flags(command):
        default, note = spec.cli_defaults.get(command, (option.default, ""))
        parser.add_argument(*spec.names, default=default, help=spec.help + note, **spec.argparse)


def engine_keywords(args: argparse.Namespace, command: str, load: bool = False) -> dict[str, Any]:
    """``command``'s flags as ``Engine`` keywords, read through the same table: those an Engine over loaded modules
    takes (``build_engine``), or with ``load`` those ``load_models`` applies when the CLI loads once (dtype,
    weights, draft_quantization, device: its keywords of the same names)."""
    return {option.name: getattr(args, spec.dest) for option, spec in engine_flags(command) if spec.load == load}


def suffix_options(args: argparse.Namespace) -> dict[str, Any]:
    """The --suffix-decoding-* flags and --speculative-hybrid-drafter given, as Engine keywords (build_engine's;
    refused unless SUFFIX or a hybrid)."""
    from specswap.algorithms import SUFFIX_OPTIONS
    given = engine_keywords(args, "bench")
    return {key: given[key] for key in (*SUFFIX_OPTIONS, "hybrid_drafter") if given[key] is not None}


def check_speculative_flags(args: argparse.Namespace, adaptive_flag: bool) -> None:
    """Start-up errors for flag combinations that would otherwise be silently ignored."""
    from specswap.worker.layout import tree_shape
    try:
        tree_shape(args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens)
    except ValueError as error:  # named as the flags name it
        raise ValueError(f"{error} (--speculative-num-steps {args.speculative_num_steps}, --speculative-eagle-topk "
                         f"{args.speculative_eagle_topk}, --speculative-num-draft-tokens "
                         f"{args.speculative_num_draft_tokens})") from None
    if args.speculative_eagle_topk > 1 and args.speculative_algorithm is not None and \
            algorithm(args.speculative_algorithm).name is None:
        raise ValueError("--speculative-eagle-topk > 1 drafts a tree: it needs a --speculative-algorithm (EAGLE, "
                         "STANDALONE or NGRAM); got NONE")
    if args.speculative_num_steps < 1:
        raise ValueError(f"--speculative-num-steps must be >= 1, got {args.speculative_num_steps}")
    if args.speculative_adaptive_config is not None and not adaptive_flag:
        raise ValueError("--speculative-adaptive-config was given without --speculative-adaptive; add "
                         "--speculative-adaptive (the config is never silently ignored)")
    if args.speculative_adaptive_config is not None and not Path(args.speculative_adaptive_config).is_file():
        raise FileNotFoundError(f"--speculative-adaptive-config {args.speculative_adaptive_config}: no such file")
    hybrid = getattr(args, "hybrid_drafter", None)
    if hybrid is not None:
        if args.speculative_algorithm is not None:
            try:
                algorithm(args.speculative_algorithm).hybrid(hybrid)
            except ValueError as error:
                raise ValueError(f"--speculative-hybrid-drafter {hybrid}: {error}") from None
    # None is "the model's default" (its head, else NGRAM); "NONE" is no speculation
    if adaptive_flag and args.speculative_algorithm is not None and algorithm(args.speculative_algorithm).name is None:
        raise ValueError("--speculative-adaptive needs a --speculative-algorithm (EAGLE, EAGLE3, STANDALONE or "
                         "NGRAM); got NONE")


def build_engine(models: LoadedModels, speculative_algorithm: str | None, speculative_num_steps: int = 3,
                 **keywords):
    """An Engine over already loaded modules (no weights are copied). ``speculative_algorithm`` None or "NONE":
    target only. ``keywords``: the Engine's others (``engine_keywords``: ``disable_graphs`` is
    ``--disable-cuda-graph``, ...); the tokenizer is the models', and dtype, weights, draft_quantization and device
    were applied when they loaded."""
    from specswap.engine import Engine
    spec = algorithm(speculative_algorithm)
    draft = models.draft if spec.needs_draft else None
    return Engine(models.target, draft, spec.name, speculative_num_steps=speculative_num_steps,
                  tokenizer=models.tokenizer, **keywords)
