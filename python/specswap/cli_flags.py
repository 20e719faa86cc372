"""The model flags shared by ``specswap serve`` and ``specswap bench``, and engines built from what they load.

Both commands take the same SGLang-style flags (``--model``, ``--draft-model``, ``--speculative-algorithm``,
``--dtype``, ``--weights``, ...); ``specswap.loading.load_models`` turns them into built modules once, and
``build_engine`` wraps those in an ``Engine`` (several engines may share one copy of the weights).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from specswap.algorithms import HYBRID_DRAFTERS, NAMES, algorithm
from specswap.loading import LoadedModels

__all__ = ["ALGORITHM_CHOICES", "DEFAULT_MODEL", "add_model_arguments", "build_engine", "check_speculative_flags",
           "suffix_options"]

DEFAULT_MODEL = "gemma-3-270m"
ALGORITHM_CHOICES = NAMES


def add_model_arguments(parser: argparse.ArgumentParser, default_algorithm: str | None) -> None:
    """The model flags, spelled as SGLang spells them."""
    parser.add_argument("--model", "--model-path", dest="model", default=DEFAULT_MODEL,
                        help=f"zoo or registry name ('tiny', 'gemma-3-270m', 'smollm2-135m'), a Hugging Face checkpoint directory or "
                             f"a .gguf file (default {DEFAULT_MODEL})")
    parser.add_argument("--draft-model", "--speculative-draft-model-path", dest="draft_model", default=None,
                        help="draft checkpoint (EAGLE head, EAGLE-3 head directory as SpecForge saves it, or "
                             "standalone model); zoo models default to <model>-eagle / <model>-draft")
    parser.add_argument("--speculative-algorithm", type=str.upper, choices=ALGORITHM_CHOICES,
                        default=default_algorithm,
                        help="EAGLE, EAGLE3 (an EAGLE-3 head: --speculative-draft-model-path DIR), STANDALONE, "
                             "NGRAM (prompt lookup, no draft model), SUFFIX (suffix trees over the request and recent "
                             "outputs, no draft model) or NONE"
                             + ("" if default_algorithm else " (default: EAGLE when the model has a head, else NGRAM)"))
    parser.add_argument("--speculative-num-steps", type=int, default=3, help="draft steps per round (static tier)")
    parser.add_argument("--speculative-eagle-topk", type=int, default=1,
                        help="children kept per expanded draft node: 1 drafts a chain, > 1 a tree of depth "
                             "--speculative-num-steps (EAGLE, STANDALONE: EAGLE-2's dynamic tree; NGRAM: a trie)")
    parser.add_argument("--speculative-num-draft-tokens", type=int, default=None,
                        help="tokens a tree's verify reads, the root included (default steps x topk + 1; a chain: "
                             "steps + 1)")
    parser.add_argument("--speculative-adaptive-config", default=None,
                        help="adaptive policy JSON (docs/policy.md); needs --speculative-adaptive (none: the goodput "
                             "default; a config naming no policy runs SGLang's EMA)")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"],
                        help="compute dtype (auto: bf16 where the CPU has native bf16, else fp32)")
    parser.add_argument("--weights", default="auto", choices=["auto", "native", "bf16", "fp32"],
                        help="native: a GGUF model's matrices stay in the file's block formats on ggml's CPU kernels "
                             "(auto: native for GGUF models on CPU when ggml is installed); bf16 / fp32: dequantized")
    parser.add_argument("--draft-quantization", default="auto", choices=["auto", "none", "int8", "q8_0"],
                        help="the EAGLE head's linears as weight-only int8 (auto: on CPU in bf16) or ggml Q8_0 blocks "
                             "(auto: with native target weights); output is unchanged")
    parser.add_argument("--device", default="cpu", help="torch device the model runs on")
    parser.add_argument("--max-batch-size", type=int, default=8, help="requests decoded together (cache slots)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: torch's choice; 1 avoids oversubscription on a shared "
                             "machine)")
    parser.add_argument("--max-seq-len", type=int, default=None,
                        help="prompt + completion tokens per request (default: the model's, capped at 2048)")
    add_suffix_arguments(parser)


def add_suffix_arguments(parser: argparse.ArgumentParser) -> None:
    """SUFFIX's trees, named as vLLM's speculative_config fields (unset: worker.suffix.SuffixConfig's defaults,
    docs/suffix.md)."""
    for name, kind, default, what in (
            ("max-tree-depth", int, 24, "tokens a suffix match and a drafted path may span"),
            ("max-cached-requests", int, 10000, "recent outputs the global tree holds, oldest evicted first (0: none)"),
            ("max-spec-factor", float, 2.0, "drafts per matched token"),
            ("min-token-prob", float, 0.1, "a draft token's estimated probability below this ends the draft")):
        parser.add_argument(f"--suffix-decoding-{name}", type=kind, default=None,
                            help=f"SUFFIX: {what} (default {default})")
    parser.add_argument("--speculative-hybrid-drafter", dest="hybrid_drafter", type=str.upper, choices=HYBRID_DRAFTERS,
                        default=None,
                        help="SUFFIX drafts beside EAGLE, EAGLE3 or STANDALONE: each round verifies, per request, the "
                             "suffix draft where its score beats the model's mean accepted drafts (chains only)")


def suffix_options(args: argparse.Namespace) -> dict[str, Any]:
    """The --suffix-decoding-* flags and --speculative-hybrid-drafter given, as Engine keywords (build_engine's;
    refused unless SUFFIX or a hybrid)."""
    from specswap.algorithms import SUFFIX_OPTIONS
    return {key: getattr(args, key) for key in (*SUFFIX_OPTIONS, "hybrid_drafter")
            if getattr(args, key, None) is not None}


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
        if args.speculative_eagle_topk > 1:
            raise ValueError(f"--speculative-hybrid-drafter {hybrid} drafts chains: --speculative-eagle-topk must be 1")
    # None is "the model's default" (its head, else NGRAM); "NONE" is no speculation
    if adaptive_flag and args.speculative_algorithm is not None and algorithm(args.speculative_algorithm).name is None:
        raise ValueError("--speculative-adaptive needs a --speculative-algorithm (EAGLE, EAGLE3, STANDALONE or "
                         "NGRAM); got NONE")


def build_engine(models: LoadedModels, speculative_algorithm: str | None, speculative_num_steps: int = 3,
                 speculative_adaptive: bool = False, speculative_adaptive_config: Any = None,
                 max_batch_size: int = 8, max_seq_len: int | None = None, disable_graphs: bool = False,
                 speculative_eagle_topk: int = 1, speculative_num_draft_tokens: int | None = None,
                 **distributed):
    """An Engine over already loaded modules (no weights are copied). ``speculative_algorithm`` None or "NONE":
    target only. ``disable_graphs`` (``--disable-cuda-graph``) runs the worker eagerly. ``distributed``: the
    Engine's tp_size, dp_size, dist_timeout, min_dwell_rounds, tp_draft (``--tp-size`` ...; unset ones left
    out), and SUFFIX's keywords (``suffix_options``)."""
    from specswap.engine import Engine
    spec = algorithm(speculative_algorithm)
    draft = models.draft if spec.needs_draft else None
    return Engine(models.target, draft, spec.name, speculative_num_steps=speculative_num_steps,
                  speculative_adaptive=speculative_adaptive, speculative_adaptive_config=speculative_adaptive_config,
                  max_batch_size=max_batch_size, max_seq_len=max_seq_len, tokenizer=models.tokenizer,
                  disable_graphs=disable_graphs, speculative_eagle_topk=speculative_eagle_topk,
                  speculative_num_draft_tokens=speculative_num_draft_tokens,
                  **{key: value for key, value in distributed.items() if value is not None})
