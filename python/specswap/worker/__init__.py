"""The speculative worker: one decode round (draft, verify, accept, extend, commit) for the whole running batch.

A tier drafts a chain (topk = 1) or a draft tree (topk > 1, ``layout``: the
accepted path is laid out as a chain). Alignment, in a chain's terms, for a
request whose committed tokens are x_0..x_{m-1} (x_{m-1} sampled but not yet
fed to the target): target KV is valid through position m-2; verify feeds
[x_{m-1}, d_1..d_k] at positions m-1..m+k-1 (T = k+1; a tree: its nodes) and
accepts a drafts plus one correction/bonus token b, so m grows by a+1;
rollback is forgetting lengths. Tier k = 0 verifies
[x_{m-1}] alone (plain decoding) and runs no draft: the draft falls behind and
the first round of a tier k >= 1 catches each lagging request up.

Rooms: ``worker`` (SpeculativeWorker: caches, the state pool of tiers, prefill,
the host side of a round), ``round`` (the round driver on tensors), ``drafter``
(the Drafter interface, no-draft, shared model-drafter parts), ``eagle``,
``eagle3``, ``standalone``, ``ngram``, ``suffix`` (one drafter per algorithm,
named in ``specswap.algorithms``), ``hybrid`` (a model drafter with SUFFIX
beside it), ``layout`` (a chain or a tree), ``slots`` (the per-request slot
table), ``tiers`` (a tier's stages and round, and the execution mode,
``Forwards``), ``row_cost`` (the verify's cost per row count).
"""

from specswap.worker.tiers import DraftExtendStage, DraftStage, TierRound, TierStages, VerifyStage
from specswap.worker.worker import ROUND_GRAPH_MAX_PARAMS, RoundResult, SpeculativeWorker

__all__ = ["SpeculativeWorker", "RoundResult", "TierStages", "TierRound", "DraftStage", "VerifyStage",
           "DraftExtendStage", "ROUND_GRAPH_MAX_PARAMS"]
