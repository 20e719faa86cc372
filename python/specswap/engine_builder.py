"""How an ``Engine`` is made: its keywords as one validated dataclass (``EngineOptions``: every check that needs no
weights runs before any load), then ``build``: the models loaded (``loading``), the verify's row costs and the
adaptive config for this machine, the distributed group's checks and shards, the worker with every tier's graphs,
the controller. ``Engine(...)``'s keywords are this dataclass's fields."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from specswap.algorithms import algorithm
from specswap.huge_pages import place_on_huge_pages
from specswap.prompt_lookup import NumberTokens
from specswap.worker import SpeculativeWorker
from specswap.worker.layout import tier_key, tree_shape

logger = logging.getLogger(__name__)

DEFAULT_MAX_SEQ_LEN = 2048


@dataclass
class EngineOptions:
    """``Engine``'s keywords (the class docstring says what each does)."""

    speculative_algorithm: str | None = "EAGLE"
    speculative_num_steps: int = 3
    speculative_adaptive: bool = False
    speculative_adaptive_config: Any = None
    device: str | torch.device = "cpu"
    dtype: str | torch.dtype = "auto"
    max_batch_size: int = 8
    max_seq_len: int | None = None
    tokenizer: Any = None
    disable_graphs: bool = False
    draft_quantization: str = "auto"
    round_graphs: bool | None = None
    ngram_numbers: bool = True
    weights: str = "auto"
    speculative_eagle_topk: int = 1
    speculative_num_draft_tokens: int | None = None
    tp_size: int = 1
    dp_size: int = 1
    dist_timeout: float | None = None
    min_dwell_rounds: int | None = None
    tp_draft: str | None = None
    row_costs: str | Mapping[int, float] = "auto"
    suffix_decoding_max_tree_depth: int | None = None
    suffix_decoding_max_cached_requests: int | None = None
    suffix_decoding_max_spec_factor: float | None = None
    suffix_decoding_min_token_prob: float | None = None
    hybrid_drafter: str | None = None

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
        if self.drafting.parts is not None:
            self.round_graphs = _hybrid_round_graphs(self.shape, self.tp_size, self.round_graphs, self.disable_graphs)
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
            self.adaptive = engine_adaptive_config(self.speculative_adaptive_config, model_drafter=spec.needs_draft)
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
        names = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(keywords) - names)
        if unknown:
            raise TypeError(f"Engine() got unknown keyword(s) {', '.join(unknown)}; it takes "
                            f"{', '.join(sorted(names))}")
        return cls(speculative_algorithm=speculative_algorithm, **keywords)


def _hybrid_round_graphs(shape, tp_size: int, round_graphs: bool | None, disable_graphs: bool) -> bool | None:
    """A hybrid's checks (chains, one process per tensor group); its ``round_graphs``: off, said once (the draft
    is chosen per request on the host, so its rounds run from stage graphs, never as one recorded round)."""
    if shape[1] > 1:
        raise ValueError("hybrid_drafter drafts chains: speculative_eagle_topk must be 1 (and the adaptive config "
                         "without candidate_trees)")
    if tp_size != 1:
        raise ValueError("hybrid_drafter runs in one process or under data parallelism (dp_size); tensor "
                         "parallelism (tp_size > 1) is not supported with it")
    if round_graphs:
        raise ValueError("round_graphs=True: a hybrid_drafter chooses each request's draft on the host, so its "
                         "rounds run from stage graphs, not whole-round graphs")
    if not disable_graphs and not _HYBRID_SAID:
        _HYBRID_SAID.append(True)
        logger.warning("specswap: hybrid drafting runs each round from its stages' graphs, not one whole-round graph "
                       "(the draft is chosen per request on the host)")
    return None if disable_graphs else False


_HYBRID_SAID: list[bool] = []  # the round-graph line logged once a process


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
