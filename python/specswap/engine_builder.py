"""How an ``Engine`` is made: its keywords as one validated dataclass (``EngineOptions``: every check that needs no
weights runs before any load), then ``build``: the models loaded (``loading``), the verify's row costs and the
adaptive config for this machine, the distributed group's checks and shards, the worker with every tier's graphs,
the controller. ``Engine(...)``'s keywords are this dataclass's fields, and each field's metadata is the one table
of its flag (``flag``: what ``specswap serve`` and ``bench`` generate theirs from) or says it has none
(``engine_only``)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

from specswap.algorithms import HYBRID_DRAFTERS, NAMES, algorithm
from specswap.huge_pages import place_on_huge_pages
from specswap.prompt_lookup import NumberTokens
from specswap.worker import SpeculativeWorker
from specswap.worker.layout import tier_key, tree_shape
from specswap.worker.suffix import SuffixConfig

logger = logging.getLogger(__name__)

DEFAULT_MAX_SEQ_LEN = 2048


@dataclass(frozen=True)
class Flag:
    """How an ``EngineOptions`` field is a command-line flag (``cli_flags.add_engine_flags`` adds it, and
    ``cli_flags.engine_keywords`` reads it back): its names (SGLang's spelling first, then aliases), help, the
    commands that take it, ``load`` when the CLI applies it in ``load_models`` (it loads once, then builds engines
    over those modules), argparse's type / choices / action / dest, and ``cli_defaults``: command -> (default,
    help note) where that command's default is not the field's, each said here."""

    names: tuple[str, ...]
    help: str
    commands: tuple[str, ...]
    load: bool
    cli_defaults: Mapping[str, tuple[Any, str]]
    argparse: Mapping[str, Any]

    @property
    def dest(self) -> str:
        """The argparse attribute the flag sets."""
        return self.argparse.get("dest") or self.names[0][2:].replace("-", "_")


def flag(*names: str, help: str, commands: tuple[str, ...] = ("serve", "bench"), load: bool = False,
         cli_defaults: Mapping[str, tuple[Any, str]] | None = None, **argparse_keywords) -> dict[str, Flag]:
    """A field's metadata: it is a flag (``Flag``)."""
    return {"flag": Flag(names, help, commands, load, dict(cli_defaults or {}), argparse_keywords)}


def engine_only(why: str) -> dict[str, str]:
    """A field's metadata: a keyword of ``Engine`` only, no flag sets it (``why``)."""
    return {"engine_only": why}


_SUFFIX = SuffixConfig()  # SUFFIX's defaults (None: the drafter's), said in the flags' help


def _suffix(name: str, kind: type, what: str):
    """A ``suffix_decoding_<name>`` field: vLLM's speculative_config name, None for SuffixConfig's default."""
    return field(default=None, metadata=flag(f"--suffix-decoding-{name.replace('_', '-')}", type=kind,
                                             help=f"SUFFIX: {what} (default {getattr(_SUFFIX, name)})"))


@dataclass
class EngineOptions:
    """``Engine``'s keywords (the class docstring says what each does), and the one table of their flags: each
    field's metadata is a ``flag`` (``specswap serve`` / ``bench`` generate it, ``cli_flags``) or ``engine_only``."""

    speculative_algorithm: str | None = field(default="EAGLE", metadata=flag(
        "--speculative-algorithm", type=str.upper, choices=NAMES,
        help="EAGLE, EAGLE3 (an EAGLE-3 head: --speculative-draft-model-path DIR), STANDALONE, NGRAM (prompt lookup, "
             "no draft model), SUFFIX (suffix trees over the request and recent outputs, no draft model) or NONE",
        # serve speculates only when asked; bench's modes draft with what the model has (loading.load_models)
        cli_defaults={"serve": ("NONE", ""),
                      "bench": (None, " (default: EAGLE when the model has a head, else NGRAM)")}))
    speculative_num_steps: int = field(default=3, metadata=flag(
        "--speculative-num-steps", type=int, help="draft steps per round (static tier)"))
    speculative_eagle_topk: int = field(default=1, metadata=flag(
        "--speculative-eagle-topk", type=int,
        help="children kept per expanded draft node: 1 drafts a chain, > 1 a tree of depth --speculative-num-steps "
             "(EAGLE, STANDALONE: EAGLE-2's dynamic tree; NGRAM: a trie)"))
    speculative_num_draft_tokens: int | None = field(default=None, metadata=flag(
        "--speculative-num-draft-tokens", type=int,
        help="tokens a tree's verify reads, the root included (default steps x topk + 1; a chain: steps + 1)"))
    speculative_adaptive_config: Any = field(default=None, metadata=flag(
        "--speculative-adaptive-config",
        help="adaptive policy JSON (docs/policy.md); needs --speculative-adaptive (none: the goodput default; a "
             "config naming no policy runs SGLang's EMA)"))
    dtype: str | torch.dtype = field(default="auto", metadata=flag(
        "--dtype", load=True, choices=["auto", "bfloat16", "float32"],
        help="compute dtype (auto: bf16 where the CPU has native bf16, else fp32)"))
    weights: str = field(default="auto", metadata=flag(
        "--weights", load=True, choices=["auto", "native", "bf16", "fp32"],
        help="native: a GGUF model's matrices stay in the file's block formats on ggml's CPU kernels (auto: native "
             "for GGUF models on CPU when ggml is installed); bf16 / fp32: dequantized"))
    draft_quantization: str = field(default="auto", metadata=flag(
        "--draft-quantization", load=True, choices=["auto", "none", "int8", "q8_0"],
        help="the EAGLE head's linears as weight-only int8 (auto: on CPU in bf16) or ggml Q8_0 blocks (auto: with "
             "native target weights); output is unchanged"))
    device: str | torch.device = field(default="cpu", metadata=flag(
        "--device", load=True, help="torch device the model runs on"))
    max_batch_size: int = field(default=8, metadata=flag(
        "--max-batch-size", type=int, help="requests decoded together (cache slots)"))
    max_seq_len: int | None = field(default=None, metadata=flag(
        "--max-seq-len", type=int,
        help=f"prompt + completion tokens per request (default: the model's, capped at {DEFAULT_MAX_SEQ_LEN})"))
    suffix_decoding_max_tree_depth: int | None = _suffix("max_tree_depth", int,
                                                         "tokens a suffix match and a drafted path may span")
    suffix_decoding_max_cached_requests: int | None = _suffix(
        "max_cached_requests", int, "recent outputs the global tree holds, oldest evicted first (0: none)")
    suffix_decoding_max_spec_factor: float | None = _suffix("max_spec_factor", float, "drafts per matched token")
    suffix_decoding_min_token_prob: float | None = _suffix(
        "min_token_prob", float, "a draft token's estimated probability below this ends the draft")
    hybrid_drafter: str | None = field(default=None, metadata=flag(
        "--speculative-hybrid-drafter", dest="hybrid_drafter", type=str.upper, choices=HYBRID_DRAFTERS,
        help="SUFFIX drafts beside EAGLE, EAGLE3 or STANDALONE: each round verifies, per request, the suffix draft "
             "where its score beats the model's mean accepted drafts (chains and trees)"))
    # serve's alone: bench runs adaptive as one of its modes, each in this one process with its graphs
    speculative_adaptive: bool = field(default=False, metadata=flag(
        "--speculative-adaptive", action="store_true", commands=("serve",),
        help="let the adaptive controller pick the draft steps per round; with no config the cost-aware goodput "
             "policy runs (tier 0 = speculation off among its tiers, chosen from this machine's measured verify "
             "costs): on a CPU a deeper verify costs more, which SGLang's EMA ('policy': 'sglang') ignores"))
    disable_graphs: bool = field(default=False, metadata=flag(
        "--disable-cuda-graph", action="store_true", commands=("serve",),
        help="run every stage eagerly instead of replaying the graphs captured at start-up"))
    tp_size: int = field(default=1, metadata=flag(
        "--tp-size", type=int, commands=("serve",),
        help="tensor-parallel ranks (under torchrun; rank 0 of each group serves HTTP; README, 'Several processes')"))
    tp_draft: str | None = field(default=None, metadata=flag(
        "--tp-draft", choices=["replicate", "shard", "leader"], commands=("serve",),
        help="tensor parallelism: every rank runs the whole draft (replicate, the default for EAGLE and draft "
             "models), the draft split like the target (shard), or NGRAM's lookups on rank 0, broadcast (leader, "
             "NGRAM's default)"))
    dp_size: int = field(default=1, metadata=flag(
        "--dp-size", type=int, commands=("serve",),
        help="data-parallel groups (under torchrun), each with its own batch; one endpoint on --port behind "
             "sglang-router (the router extra), else each on --port + its index; tier switches agreed by all "
             "(docs/scale-out.md)"))
    dist_timeout: float | None = field(default=None, metadata=flag(
        "--dist-timeout", type=float, commands=("serve",),
        help="seconds a collective waits for a peer before failing with the rank's name (default 60)"))
    min_dwell_rounds: int | None = field(default=None, metadata=flag(
        "--min-dwell-rounds", type=int, commands=("serve",),
        help="distributed: steps at least between two tier switches (default 8)"))
    tokenizer: Any = field(default=None, metadata=engine_only(
        "a tokenizer object for a built model (the CLI's comes with the models it loads)"))
    round_graphs: bool | None = field(default=None, metadata=engine_only(
        "None: whole-round graphs up to 50M parameters; the CLI keeps that"))
    ngram_numbers: bool = field(default=True, metadata=engine_only("the CLI keeps NGRAM's number extrapolation on"))
    row_costs: str | Mapping[int, float] = field(default="auto", metadata=engine_only(
        "'auto', 'off' or a {rows: cost} mapping; the CLI measures them (cached)"))

    def __post_init__(self):
        """Every check that needs no weights, and what follows from the keywords (``plan``)."""
        spec = self.spec = algorithm(self.speculative_algorithm)
        self.drafting = spec.hybrid(self.hybrid_drafter)  # what the worker drafts with: spec, or "EAGLE+SUFFIX"
        self.drafter_options = self.drafting.drafter_options(  # SUFFIX's (None: its default); refused for others
            **{name: getattr(self, name) for name in ("suffix_decoding_max_tree_depth",
                                                      "suffix_decoding_max_cached_requests",
                                                      "suffix_decoding_max_spec_factor",
                                                      "suffix_decoding_min_token_prob")})
        self.shape = tree_shape(self.speculative_num_steps, self.speculative_eagle_topk,
                                self.speculative_num_draft_tokens)
        if self.shape[1] > 1 and spec.name is None:
            raise ValueError("speculative_eagle_topk > 1 needs a speculative_algorithm (EAGLE, STANDALONE or NGRAM)")
        if self.drafting.parts is not None and self.tp_size != 1:
            raise ValueError("hybrid_drafter runs in one process or under data parallelism (dp_size); tensor "
                             "parallelism (tp_size > 1) is not supported with it")
        self._check_distributed()
        if self.speculative_adaptive_config is not None and not self.speculative_adaptive:
            raise ValueError("speculative_adaptive_config was given but speculative_adaptive is False; pass "
                             "speculative_adaptive=True to use it (the config is never silently ignored)")
        if self.speculative_adaptive and spec.name is None:
            raise ValueError("speculative_adaptive=True needs a speculative_algorithm ('EAGLE', 'STANDALONE' or "
                             "'NGRAM'); got None")
        if isinstance(self.max_batch_size, bool) or not isinstance(self.max_batch_size, int) or self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be an int >= 1; got {self.max_batch_size!r}")
        self.adaptive = None  # adaptive_config.AdaptiveSetting: its "auto" tiers chosen once row costs are known
        if self.speculative_adaptive:  # None config: the default policy for this drafter
            from specswap.adaptive_config import engine_adaptive_config
            self.adaptive = engine_adaptive_config(self.speculative_adaptive_config, model_drafter=spec.needs_draft,
                                                   hybrid=self.drafting.parts is not None)
        from specswap.worker.row_cost import check_request
        check_request(self.row_costs)

    def _check_distributed(self) -> None:
        distributed = self.tp_size != 1 or self.dp_size != 1
        if not distributed and (self.dist_timeout is not None or self.min_dwell_rounds is not None):
            raise ValueError("dist_timeout and min_dwell_rounds apply to distributed engines; pass tp_size or "
                             "dp_size > 1 (under torchrun) or leave them unset")
        if self.tp_draft is not None and self.tp_size == 1:
            raise ValueError("tp_draft places the drafts of a tensor-parallel engine; pass tp_size > 1 (under "
                             "torchrun) or leave it unset")
        self.tp_draft = self.spec.tp_draft(self.tp_draft)

    @classmethod
    def of(cls, speculative_algorithm, keywords: dict[str, Any]) -> EngineOptions:
        """The options from Engine's keywords; an unknown keyword is a TypeError naming it."""
        names = {option.name for option in dataclasses.fields(cls)}
        unknown = sorted(set(keywords) - names)
        if unknown:
            raise TypeError(f"Engine() got unknown keyword(s) {', '.join(unknown)}; it takes "
                            f"{', '.join(sorted(names))}")
        return cls(speculative_algorithm=speculative_algorithm, **keywords)


def _load(model, draft, options: EngineOptions):
    from specswap.loading import load_models, prepare_built
    if isinstance(model, torch.nn.Module):
        draft, built_weights = prepare_built(model, draft, options.speculative_algorithm, options.weights,
                                             options.draft_quantization)
        return model, draft, options.tokenizer, built_weights
    loaded = load_models(model, draft, options.speculative_algorithm or "NONE", options.dtype, options.device,
                         options.draft_quantization, options.weights, options.tokenizer)
    return loaded.target, loaded.draft, loaded.tokenizer, loaded.weights


def _max_seq_len(target, requested: int | None) -> int:
    max_positions = target.config.max_position_embeddings
    value = min(max_positions, DEFAULT_MAX_SEQ_LEN) if requested is None else requested
    if isinstance(value, bool) or not isinstance(value, int) or not 2 <= value <= max_positions:
        raise ValueError(f"max_seq_len must be an int in 2..{max_positions} (the model's max_position_embeddings); "
                         f"got {value!r}")
    return value


def _adaptive_config(engine, options: EngineOptions):
    """The verify's row costs (measured, cached or given; None when skipped or failed, said once) into
    ``engine.row_costs``, and the adaptive config with its "auto" chains and trees chosen from them."""
    if options.adaptive is None:
        return None
    config = options.adaptive.config
    if config.policy != "goodput":
        return config
    from specswap.worker.row_cost import resolve_row_costs
    engine.row_costs = resolve_row_costs(options.row_costs, engine.target, engine.weights,
                                         distributed=engine.dist is not None)
    config = options.adaptive.for_machine(engine.row_costs)
    logger.info("specswap: %s", options.adaptive.describe(config, engine.row_costs))
    return config


def build(engine, model, draft, options: EngineOptions) -> None:
    """Load, measure, check, shard and capture: the engine's target, draft, tokenizer, weights, row costs, worker
    and controller."""
    engine.dist = None  # a distributed.Lockstep when tp_size or dp_size > 1
    if options.tp_size != 1 or options.dp_size != 1:
        from specswap.distributed.lockstep import Lockstep, join
        engine.dist = Lockstep(join(options.tp_size, options.dp_size, options.dist_timeout, options.device,
                                    eager=options.disable_graphs))
    engine.target, engine.draft, engine.tokenizer, engine.weights = _load(model, draft, options)
    engine.max_seq_len, engine.max_batch_size = _max_seq_len(engine.target, options.max_seq_len), options.max_batch_size
    engine.speculative_algorithm, engine.tp_draft = options.spec.name, options.tp_draft
    if engine.dist is None:  # CPU weights before costs are measured and graphs captured (distributed: sharded)
        place_on_huge_pages(engine.target, engine.draft)
    engine.row_costs = None  # worker.row_cost.RowCosts: the goodput policy's prior and "auto" tiers
    config = _adaptive_config(engine, options)
    tiers = () if config is None else (  # the chains and the trees the policy chooses among, by key
        *config.candidate_steps, *(tier_key(*tree) for tree in config.candidate_trees))
    if engine.dist is not None:  # every rank's configuration checked, then the target sharded (in place)
        engine.dist.prepare(engine, tiers=tiers, start_tier=tier_key(*options.shape), adaptive_config=config,
                            disable_graphs=options.disable_graphs, tp_draft=options.tp_draft)
        place_on_huge_pages(engine.target, engine.draft)  # the shards (no rank measures row costs: they are given)
    numbers = None  # NGRAM drafts extrapolate counters where the tokenizer writes digits one per token
    if options.spec.number_tokens and options.ngram_numbers and engine.tokenizer is not None:
        numbers = NumberTokens.from_tokenizer(engine.tokenizer)
    # graphs: every stage of every tier captured once here (specswap.graphs); disable_graphs runs eagerly
    with contextlib.nullcontext() if engine.dist is None else engine.dist.starting(engine, options.tp_draft):
        engine.worker = SpeculativeWorker(
            engine.target, engine.draft, options.drafting.name, options.speculative_num_steps,
            options.max_batch_size, engine.max_seq_len, tiers=tiers, graphs=not options.disable_graphs,
            round_graphs=None if options.disable_graphs else options.round_graphs, number_tokens=numbers,
            speculative_eagle_topk=options.shape[1], speculative_num_draft_tokens=options.shape[2],
            drafter_options=options.drafter_options)
    engine.controller = None
    if options.speculative_adaptive:
        from specswap.controller import AdaptiveController
        engine.controller = AdaptiveController(engine.worker.pool, config,
                                               shadows=bool(engine.worker.drafter.shadow_steps),
                                               row_costs=None if engine.row_costs is None else engine.row_costs.costs)
        if engine.dist is not None:  # fed the merged observations of every rank, once a step
            engine.controller = engine.dist.agree(engine.controller, engine.worker, options.min_dwell_rounds)
    eos = set(getattr(engine.tokenizer, "eos_token_ids", None) or ()) or set(engine.target.config.eos_token_id or ())
    engine.eos_token_ids = frozenset(eos)
    engine.worker.slots.eos_token_ids = tuple(sorted(eos))  # what min_new_tokens masks
