"""specswap over torch.distributed: the process group and its failure path (``group``), the start-up
configuration check (``config_check``), tensor parallelism of the target (``tensor_parallel``), the engine's
lockstep across ranks (``lockstep``) and the per-round tier agreement (``agreement``). README, "Several processes"."""

from specswap.distributed.config_check import ConfigMismatch, check_same_config, engine_fingerprint
from specswap.distributed.group import (DEFAULT_TIMEOUT_S, DistributedGroup, RankFailure, backend_for, current_group,
                                        init_group)
from specswap.distributed.tensor_parallel import shard_draft, shard_target, vocab_parallel_argmax

__all__ = ["ConfigMismatch", "DEFAULT_TIMEOUT_S", "DistributedGroup", "RankFailure", "backend_for",
           "check_same_config", "current_group", "engine_fingerprint", "init_group", "shard_draft", "shard_target",
           "vocab_parallel_argmax"]
