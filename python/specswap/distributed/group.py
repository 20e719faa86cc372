"""The process group specswap runs over, and what happens when a rank dies or hangs.

``init_group(tp_size, dp_size, timeout_s)`` joins the job torchrun (or any launcher setting ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) started: gloo on the CPU, NCCL on CUDA, HCCL on Ascend
(``backend_for``). Ranks are laid out as ``dp_size`` groups of ``tp_size`` consecutive ranks.

Every collective specswap makes goes through ``DistributedGroup``'s methods, which count them and turn a failure
into ``RankFailure`` naming the rank at fault, never a silent hang:

- a collective waits at most ``timeout_s`` (the process group's timeout), then raises;
- a heartbeat thread per rank writes ``(beat, collectives entered)`` to the job's key-value store every
  ``timeout_s / 10`` seconds (at most 0.5 s); after a failed collective the survivor reads every peer's
  heartbeat twice: a rank whose beat did not move died (a store that no longer answers is rank 0's, which hosts
  it), a rank that beats but has entered fewer collectives is hung.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["DEFAULT_TIMEOUT_S", "DistributedGroup", "RankFailure", "backend_for", "init_group"]

DEFAULT_TIMEOUT_S = 60.0
_BACKENDS = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}
# torch >= 2.13 names it all_gather_single (all_gather_into_tensor warns)
_ALL_GATHER_SINGLE = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


# the forwards' collectives: functional (torch.ops._c10d_functional), dispatcher operators that return a new
# tensor, so a CPU operator tape or a CUDA graph records them and a replay runs them again
def _sum(tensor: torch.Tensor, group_name: str) -> torch.Tensor:
    ops = torch.ops._c10d_functional
    return ops.wait_tensor(ops.all_reduce(tensor, "sum", group_name))


def _gather(tensor: torch.Tensor, size: int, group_name: str) -> torch.Tensor:
    ops = torch.ops._c10d_functional
    gathered = ops.wait_tensor(ops.all_gather_into_tensor(tensor.contiguous(), size, group_name))
    return gathered.view(size, *tensor.shape)


class RankFailure(RuntimeError):
    """A peer rank died or hung; ``ranks`` names it (them), ``collective`` the operation that failed."""

    def __init__(self, message: str, ranks: list[int], collective: str):
        super().__init__(message)
        self.ranks = ranks
        self.collective = collective


def backend_for(device: str | torch.device) -> str:
    """The torch.distributed backend for a device type: gloo (cpu), nccl (cuda), hccl (npu)."""
    kind = device.type if isinstance(device, torch.device) else str(device).split(":")[0]  # "npu" needs torch_npu
    if kind not in _BACKENDS:
        raise ValueError(f"no distributed backend for device type {kind!r}; supported: {sorted(_BACKENDS)}")
    return _BACKENDS[kind]


def _env_int(name: str) -> int:
    value = os.environ.get(name)
    if value is None:
        raise RuntimeError(f"tp_size/dp_size > 1 needs a torch.distributed launch: {name} is not set (run under "
                           f"`torchrun --nproc-per-node N ...`, or set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)")
    return int(value)


@dataclass
class _Heartbeat:
    beat: int = 0
    collectives: int = 0


class DistributedGroup:
    """This rank's place in the job (``rank``, ``world_size``, ``tp_rank``, ``dp_rank``), its tensor- and
    data-parallel groups, and the guarded collectives every specswap component calls."""

    def __init__(self, tp_size: int, dp_size: int, timeout_s: float, backend: str, store: Any, rank: int,
                 world_size: int):
        self.tp_size, self.dp_size = tp_size, dp_size
        self.timeout_s = float(timeout_s)
        self.backend = backend
        self.rank, self.world_size = rank, world_size
        self.tp_rank, self.dp_rank = rank % tp_size, rank // tp_size
        self._store = store
        self.collectives = 0
        self.tp_ranks = [self.dp_rank * tp_size + r for r in range(tp_size)]
        self.dp_ranks = [self.tp_rank + d * tp_size for d in range(dp_size)]
        # every rank creates every group, in the same order (torch.distributed's rule)
        self.tp_group = self.dp_group = None
        for d in range(dp_size):
            ranks = [d * tp_size + r for r in range(tp_size)]
            group = dist.new_group(ranks) if tp_size < world_size else dist.group.WORLD
            if self.rank in ranks:
                self.tp_group = group
        for t in range(tp_size):
            ranks = [t + d * tp_size for d in range(dp_size)]
            group = dist.new_group(ranks) if dp_size < world_size else dist.group.WORLD
            if self.rank in ranks:
                self.dp_group = group
        self._interval = min(0.5, self.timeout_s / 10)
        self._beat = _Heartbeat()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._heartbeat, name=f"specswap-heartbeat-{rank}", daemon=True)
        self._thread.start()

    # ---- collectives -----------------------------------------------------------------------------

    def _run(self, name: str, fn, *args, **kwargs):
        self.collectives += 1
        self._beat.collectives = self.collectives
        return self.guard(name, fn, *args, **kwargs)

    # ---- the forwards' collectives over the tensor-parallel group (functional: graphs record them) ----------

    def tp_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The sum of ``tensor`` over the tensor-parallel ranks, as a new tensor."""
        return self._run("all_reduce", _sum, tensor, self.tp_group.group_name)

    def tp_stack(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every tensor-parallel rank's ``tensor`` stacked in rank order: [tp_size, *tensor.shape]."""
        return self._run("all_gather", _gather, tensor, self.tp_size, self.tp_group.group_name)

    def tp_cat(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every tensor-parallel rank's ``tensor`` [..., d] concatenated along the last dim, in rank order."""
        stacked = self.tp_stack(tensor)                                  # [N, ..., d]
        return stacked.movedim(0, -2).reshape(*tensor.shape[:-1], self.tp_size * tensor.shape[-1])

    def guard(self, name: str, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` (a replayed graph holding collectives) with its failure diagnosed as a
        ``RankFailure`` naming the rank, as the collectives called from Python are; counts no collective."""
        try:
            return fn(*args, **kwargs)
        except RankFailure:
            raise
        except Exception as error:  # gloo: a closed connection, a timeout; nccl: a watchdog abort
            raise self._diagnose(name, error) from error

    def all_gather_into(self, out: torch.Tensor, tensor: torch.Tensor, group: str = "dp") -> torch.Tensor:
        """``out``: [group size, *tensor.shape], preallocated by the caller (the per-round agreement)."""
        self._run("all_gather", _ALL_GATHER_SINGLE, out, tensor, group=self._group(group))
        return out

    def all_gather_object(self, obj: Any, group: str = "world") -> list[Any]:
        out: list[Any] = [None] * self._size(group)
        self._run("all_gather_object", dist.all_gather_object, out, obj, group=self._group(group))
        return out

    def broadcast_object(self, obj: Any, src_tp_rank: int = 0) -> Any:
        """``obj`` from the tensor-parallel group's rank ``src_tp_rank`` to the others (their argument ignored)."""
        box = [obj]
        self._run("broadcast", dist.broadcast_object_list, box, src=self.tp_ranks[src_tp_rank], group=self.tp_group)
        return box[0]

    def broadcast(self, tensor: torch.Tensor, src_tp_rank: int = 0) -> torch.Tensor:
        """``tensor`` (in place) from the tensor-parallel group's rank ``src_tp_rank`` to the others."""
        self._run("broadcast", dist.broadcast, tensor, src=self.tp_ranks[src_tp_rank], group=self.tp_group)
        return tensor

    def barrier(self) -> None:
        self._run("barrier", dist.barrier)

    def _group(self, name: str):
        return {"tp": self.tp_group, "dp": self.dp_group, "world": dist.group.WORLD}[name]

    def _size(self, name: str) -> int:
        return {"tp": self.tp_size, "dp": self.dp_size, "world": self.world_size}[name]

    # ---- failure ---------------------------------------------------------------------------------

    def _heartbeat(self) -> None:
        key = f"specswap/heartbeat/{self.rank}"
        while not self._stop.is_set():
            self._beat.beat += 1
            try:
                self._store.set(key, f"{self._beat.beat}:{self._beat.collectives}")
            except Exception:  # the store (rank 0) is gone: the main thread's next collective reports it
                return
            self._stop.wait(self._interval)

    def _read_beats(self) -> dict[int, tuple[int, int] | None]:
        beats: dict[int, tuple[int, int] | None] = {}
        for rank in range(self.world_size):
            if rank == self.rank:
                continue
            try:
                if not self._store.check([f"specswap/heartbeat/{rank}"]):
                    beats[rank] = None
                    continue
                beat, collectives = self._store.get(f"specswap/heartbeat/{rank}").decode().split(":")
                beats[rank] = (int(beat), int(collectives))
            except Exception:
                raise _StoreGone() from None
        return beats

    def _diagnose(self, name: str, error: BaseException) -> RankFailure:
        """Which rank made collective ``name`` fail: one that stopped beating (died) or one behind (hung)."""
        try:
            first = self._read_beats()
            time.sleep(3 * self._interval)
            second = self._read_beats()
        except _StoreGone:
            dead = [0] if self.rank != 0 else []
            return RankFailure(f"rank {self.rank}: collective #{self.collectives} ({name}) failed and the job's "
                               f"store, which rank 0 hosts, no longer answers: rank 0 died ({error})",
                               dead, name)
        dead = [r for r in second if second[r] is None or first[r] == second[r]]
        behind = [r for r in second if r not in dead and second[r][1] < self.collectives]
        if dead:
            what = f"rank{'s' if len(dead) > 1 else ''} {', '.join(map(str, dead))} died (no heartbeat)"
        elif behind:
            what = (f"rank{'s' if len(behind) > 1 else ''} {', '.join(map(str, behind))} hung (still before "
                    f"collective #{self.collectives})")
        else:
            what = "no peer is dead or behind (a network or backend failure)"
        return RankFailure(f"rank {self.rank}: collective #{self.collectives} ({name}) failed within the "
                           f"{self.timeout_s:g} s timeout: {what}; {type(error).__name__}: {error}",
                           dead or behind, name)

    def close(self) -> None:
        """Stop the heartbeat (joined: no store call may outlive the process group) and leave the group. Rank 0
        hosts the job's store: it leaves last, once every rank said it left, so no rank's teardown meets a store
        that is already gone (which aborts that process)."""
        self._stop.set()
        self._thread.join(timeout=5 * self._interval + 1)
        if dist.is_initialized():
            dist.destroy_process_group()
        try:
            self._store.add("specswap/closed", 1)
            if self.rank == 0:
                deadline = time.monotonic() + self.timeout_s
                while int(self._store.add("specswap/closed", 0)) < self.world_size and time.monotonic() < deadline:
                    time.sleep(0.01)
        except Exception:  # a peer's store already gone: nothing left to wait for
            pass
        # release the store now (rank 0: its server and that server's thread), while the interpreter is whole;
        # held by the module's group until interpreter exit, its destruction there can abort the process. The
        # process groups hold it too (through their prefix stores), so they go with it.
        self._store = self.tp_group = self.dp_group = None


class _StoreGone(Exception):
    pass


_GROUP: DistributedGroup | None = None


def init_group(tp_size: int = 1, dp_size: int = 1, timeout_s: float | None = None,
               device: str | torch.device = "cpu") -> DistributedGroup:
    """Join (once per process) the job the launcher started, as ``dp_size`` x ``tp_size`` ranks.

    ``timeout_s`` (default ``SPECSWAP_DIST_TIMEOUT`` or 60): how long any collective may wait for a peer.
    A second call returns the same group, and raises if asked for another layout.
    """
    global _GROUP
    for name, value in (("tp_size", tp_size), ("dp_size", dp_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1; got {value!r}")
    if timeout_s is None:
        timeout_s = float(os.environ.get("SPECSWAP_DIST_TIMEOUT", DEFAULT_TIMEOUT_S))
    if not timeout_s > 0:
        raise ValueError(f"the distributed timeout must be > 0 seconds; got {timeout_s!r}")
    if _GROUP is not None:
        if (_GROUP.tp_size, _GROUP.dp_size) != (tp_size, dp_size):
            raise ValueError(f"this process already joined as tp_size={_GROUP.tp_size}, dp_size={_GROUP.dp_size}; "
                             f"got tp_size={tp_size}, dp_size={dp_size}")
        return _GROUP
    rank, world_size = _env_int("RANK"), _env_int("WORLD_SIZE")
    if tp_size * dp_size != world_size:
        raise ValueError(f"tp_size ({tp_size}) x dp_size ({dp_size}) = {tp_size * dp_size} ranks, but the launcher "
                         f"started WORLD_SIZE={world_size}")
    backend = backend_for(device)
    timeout = timedelta(seconds=timeout_s)
    addr, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), _env_int("MASTER_PORT")
    if dist.is_initialized():  # the caller set the group up: use its store through a client of our own
        store = dist.TCPStore(addr, port, world_size, False, timeout=timeout)
    else:
        # torchrun's agent may already host a store at MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE): join it
        master = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
        store = dist.TCPStore(addr, port, world_size, master, timeout=timeout)
        dist.init_process_group(backend, store=dist.PrefixStore("specswap/pg", store), rank=rank,
                                world_size=world_size, timeout=timeout)
    _GROUP = DistributedGroup(tp_size, dp_size, timeout_s, backend, store, rank, world_size)
    return _GROUP


def current_group() -> DistributedGroup | None:
    return _GROUP
