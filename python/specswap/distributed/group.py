"""The process group specswap runs over, and what happens when a rank dies or hangs.

``init_group(tp_size, dp_size, timeout_s)`` joins the job torchrun (or any launcher setting ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) started: gloo on the CPU, NCCL on CUDA, HCCL on Ascend
(``backend_for``). Ranks are laid out as ``dp_size`` groups of ``tp_size`` consecutive ranks.

Every collective specswap makes goes through ``DistributedGroup``'s methods, which count them and turn a failure
into ``RankFailure`` naming the rank at fault, never a silent hang:

- a collective waits at most ``timeout_s`` (the process group's timeout), then raises;
- a heartbeat thread per rank writes ``(beat, position)`` to the job's key-value store every ``timeout_s / 10``
  seconds (at most 0.5 s). The position is what every rank does alike (``enter``): its engine step, the stage of
  that step (the leader's broadcast, the forwards, the agreement) and, within a tensor-parallel group, how many
  forwards (prefills and rounds, eager or replayed graphs alike) it entered. After a failed collective the
  survivor reads the heartbeats of the collective's ranks twice: a rank whose beat did not move died (a store that
  no longer answers is rank 0's, which hosts it); of the ranks that beat but stand behind it, the furthest behind
  hung (the others wait on it).

Start-up ends with ``wait_started``: every rank waits (``start_timeout_s``, default ``SPECSWAP_DIST_START_TIMEOUT``
or max(``timeout_s``, 600)) until every other has built its graphs, and a rank that failed is named. ``close()``
leaves; rank 0 leaves last (it hosts the store). It also runs at interpreter exit if nobody called it.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["DEFAULT_START_TIMEOUT_S", "DEFAULT_TIMEOUT_S", "DistributedGroup", "RankFailure", "backend_for",
           "init_group"]

DEFAULT_TIMEOUT_S = 60.0
DEFAULT_START_TIMEOUT_S = 600.0  # graph capture may take minutes; the start-up barrier waits at least this
# the stages of a step every rank passes alike (``DistributedGroup.enter``)
BEGIN, FORWARD, AGREE = 0, 1, 2
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
    step: int = 0       # engine steps entered (0: start-up)
    stage: int = BEGIN  # BEGIN, FORWARD or AGREE within the step
    forwards: int = 0   # forwards entered in this step (alike within a tensor-parallel group only)

    def position(self) -> str:
        return f"{self.step}:{self.stage}:{self.forwards}"


class DistributedGroup:
    """This rank's place in the job (``rank``, ``world_size``, ``tp_rank``, ``dp_rank``), its tensor- and
    data-parallel groups, and the guarded collectives every specswap component calls."""

    def __init__(self, tp_size: int, dp_size: int, timeout_s: float, backend: str, store: Any, rank: int,
                 world_size: int, start_timeout_s: float | None = None):
        self.tp_size, self.dp_size = tp_size, dp_size
        self.timeout_s = float(timeout_s)
        self.start_timeout_s = max(self.timeout_s, DEFAULT_START_TIMEOUT_S) if start_timeout_s is None \
            else float(start_timeout_s)
        self.closed = False
        self.broken = False  # a collective failed (RankFailure): no orderly shutdown is possible
        self.backend = backend
        self.rank, self.world_size = rank, world_size
        self.tp_rank, self.dp_rank = rank % tp_size, rank // tp_size
        self._store = store
        self.collectives = 0
        self.tp_ranks = [self.dp_rank * tp_size + r for r in range(tp_size)]
        self.dp_ranks = [self.tp_rank + d * tp_size for d in range(dp_size)]
        # every rank creates every group, in the same order (torch.distributed's rule); with the job's timeout (a
        # new group's default is torch's, 30 minutes on gloo)
        self.tp_group = self.dp_group = None
        timeout = timedelta(seconds=self.timeout_s)
        for d in range(dp_size):
            ranks = [d * tp_size + r for r in range(tp_size)]
            group = dist.new_group(ranks, timeout=timeout) if tp_size < world_size else dist.group.WORLD
            if self.rank in ranks:
                self.tp_group = group
        for t in range(tp_size):
            ranks = [t + d * tp_size for d in range(dp_size)]
            group = dist.new_group(ranks, timeout=timeout) if dp_size < world_size else dist.group.WORLD
            if self.rank in ranks:
                self.dp_group = group
        self._interval = min(0.5, self.timeout_s / 10)
        self._beat = _Heartbeat()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._heartbeat, name=f"specswap-heartbeat-{rank}", daemon=True)
        self._thread.start()

    # ---- collectives -----------------------------------------------------------------------------

    def _run(self, name: str, fn, *args, peers: str = "tp", **kwargs):
        self.collectives += 1
        return self.guard(name, fn, *args, peers=peers, **kwargs)

    def enter(self, stage: int) -> None:
        """This rank reached ``stage`` of its step: ``BEGIN`` starts the next step, ``FORWARD`` is one more forward
        (a prefill or a round, eager or a replayed graph), ``AGREE`` the step's agreement. The heartbeat reports it;
        ``_diagnose`` compares it."""
        beat = self._beat
        if stage == BEGIN:
            beat.step += 1
            beat.forwards = 0
        elif stage == FORWARD:
            beat.forwards += 1
        beat.stage = stage

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

    def guard(self, name: str, fn, *args, peers: str = "tp", **kwargs):
        """``fn(*args, **kwargs)`` (a replayed graph holding collectives) with its failure diagnosed as a
        ``RankFailure`` naming the rank among ``peers`` ("tp", "dp" or "world": the ranks it meets), as the
        collectives called from Python are; counts no collective."""
        try:
            return fn(*args, **kwargs)
        except RankFailure:
            self.broken = True
            raise
        except Exception as error:  # gloo: a closed connection, a timeout; nccl: a blocking wait's timeout
            self.broken = True
            raise self._diagnose(name, error, peers) from error

    def all_gather_into(self, out: torch.Tensor, tensor: torch.Tensor, group: str = "dp") -> torch.Tensor:
        """``out``: [group size, *tensor.shape], preallocated by the caller (the per-round agreement)."""
        self._run("all_gather", _ALL_GATHER_SINGLE, out, tensor, group=self._group(group), peers=group)
        return out

    def all_gather_object(self, obj: Any, group: str = "world") -> list[Any]:
        out: list[Any] = [None] * self._size(group)
        self._run("all_gather_object", dist.all_gather_object, out, obj, group=self._group(group), peers=group)
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
        self._run("barrier", dist.barrier, peers="world")

    def _group(self, name: str):
        return {"tp": self.tp_group, "dp": self.dp_group, "world": dist.group.WORLD}[name]

    def _size(self, name: str) -> int:
        return {"tp": self.tp_size, "dp": self.dp_size, "world": self.world_size}[name]

    def _ranks(self, name: str) -> list[int]:
        return {"tp": self.tp_ranks, "dp": self.dp_ranks, "world": list(range(self.world_size))}[name]

    # ---- failure ---------------------------------------------------------------------------------

    def _heartbeat(self) -> None:
        key = f"specswap/heartbeat/{self.rank}"
        while not self._stop.is_set():
            self._beat.beat += 1
            try:
                self._store.set(key, f"{self._beat.beat}:{self._beat.position()}")
            except Exception:  # the store (rank 0) is gone: the main thread's next collective reports it
                return
            self._stop.wait(self._interval)

    def _read_beat(self, rank: int) -> tuple[int, tuple[int, ...]] | None:
        """``rank``'s last heartbeat (beat, position), None before its first; raises _StoreGone if the store is."""
        key = f"specswap/heartbeat/{rank}"
        try:
            if not self._store.check([key]):
                return None
            beat, *position = map(int, self._store.get(key).decode().split(":"))
        except Exception:
            raise _StoreGone() from None
        return beat, tuple(position)

    def _hung(self, positions: dict[int, tuple[int, ...]]) -> list[int]:
        """Of the live peers at ``positions`` (step, stage, forwards), those furthest behind this rank: ranks of
        another tensor-parallel group compare by step and stage (their forwards differ), of this group by all three.
        The ranks behind a hung one wait on it: only the furthest behind are named."""
        mine = (self._beat.step, self._beat.stage, self._beat.forwards)
        same = lambda r: r // self.tp_size == self.dp_rank  # noqa: E731
        behind = [r for r, at in positions.items() if (at < mine if same(r) else at[:2] < mine[:2])]
        if not behind:
            return []
        lowest = min(positions[r][:2] for r in behind)
        hung = [r for r in behind if positions[r][:2] == lowest]
        fewest = {}  # per tensor-parallel group: the fewest forwards entered (within a group they compare)
        for r in hung:
            fewest[r // self.tp_size] = min(fewest.get(r // self.tp_size, positions[r][2]), positions[r][2])
        return [r for r in hung if positions[r][2] == fewest[r // self.tp_size]]

    def _diagnose(self, name: str, error: BaseException, peers: str = "world") -> RankFailure:
        """Which of the ranks collective ``name`` met (``peers``) made it fail: one that stopped beating (died)
        or one behind (hung)."""
        ranks = [r for r in self._ranks(peers) if r != self.rank]
        step = f"step {self._beat.step}" if self._beat.step else "start-up"
        try:
            first = {r: self._read_beat(r) for r in ranks}
            time.sleep(3 * self._interval)
            second = {r: self._read_beat(r) for r in ranks}
        except _StoreGone:
            dead = [0] if self.rank != 0 else []
            return RankFailure(f"rank {self.rank}: collective #{self.collectives} ({name}, {step}) failed and the "
                               f"job's store, which rank 0 hosts, no longer answers: rank 0 died ({error})",
                               dead, name)
        dead = [r for r in ranks if second[r] is None or first[r] == second[r]]
        hung = self._hung({r: second[r][1] for r in ranks if r not in dead})
        if dead:
            what = f"rank{'s' if len(dead) > 1 else ''} {', '.join(map(str, dead))} died (no heartbeat)"
        elif hung:
            what = (f"rank{'s' if len(hung) > 1 else ''} {', '.join(map(str, hung))} hung (behind this rank, "
                    f"at {', '.join('step %d stage %d' % second[r][1][:2] for r in hung)})")
        else:
            what = "no peer is dead or behind (a network or backend failure)"
        return RankFailure(f"rank {self.rank}: collective #{self.collectives} ({name}, {step}) failed within the "
                           f"{self.timeout_s:g} s timeout: {what}; {type(error).__name__}: {error}",
                           dead or hung, name)

    # ---- start-up and exit ---------------------------------------------------------------------------

    def _silent_for(self) -> float:
        """Seconds a peer's heartbeat may stand still at start-up or exit before it counts as dead (a long call
        that holds the interpreter can pause it)."""
        return max(10.0, 10 * self._interval)

    def wait_started(self, failure: BaseException | None = None) -> None:
        """The start-up barrier, after every rank captured its graphs: wait (at most ``start_timeout_s``, not the
        collectives' timeout: captures take as long as they take) until every rank started. ``failure``: this rank
        did not (its error is posted for the others, and it returns at once to raise its own). A rank that failed,
        died or did not finish in time raises ``RankFailure`` naming it."""
        try:
            self._store.set(f"specswap/started/{self.rank}", "ok" if failure is None else
                            f"{type(failure).__name__}: {failure}"[:2000])
        except Exception:
            if failure is not None:
                return
            raise RankFailure(f"rank {self.rank}: the job's store, which rank 0 hosts, no longer answers at "
                              f"start-up: rank 0 died", [0], "start-up") from None
        if failure is not None:
            return
        began = time.monotonic()
        pending = {r: (None, began) for r in range(self.world_size) if r != self.rank}  # rank: (beat, since)
        while pending:
            now = time.monotonic()
            for rank in sorted(pending):
                try:
                    posted = self._store.check([f"specswap/started/{rank}"])
                    value = self._store.get(f"specswap/started/{rank}").decode() if posted else None
                    beat = self._read_beat(rank)
                except Exception:
                    self.broken = True
                    raise RankFailure(f"rank {self.rank}: the job's store, which rank 0 hosts, no longer answers "
                                      f"at start-up: rank 0 died", [0], "start-up") from None
                if value == "ok":
                    del pending[rank]
                elif value is not None:
                    self.broken = True
                    raise RankFailure(f"rank {self.rank}: rank {rank} failed to start (graph capture): {value}",
                                      [rank], "start-up")
                elif beat != pending[rank][0]:
                    pending[rank] = (beat, now)
                elif now - pending[rank][1] > self._silent_for():
                    self.broken = True
                    raise RankFailure(f"rank {self.rank}: rank {rank} died during start-up (no heartbeat for "
                                      f"{now - pending[rank][1]:.0f} s)", [rank], "start-up")
            if pending and now - began > self.start_timeout_s:
                self.broken = True
                late = sorted(pending)
                raise RankFailure(f"rank {self.rank}: rank{'s' if len(late) > 1 else ''} {', '.join(map(str, late))} "
                                  f"did not finish start-up (graph capture) within the {self.start_timeout_s:g} s "
                                  f"start-up timeout (SPECSWAP_DIST_START_TIMEOUT)", late, "start-up")
            time.sleep(0.01)

    def close(self) -> None:
        """Stop the heartbeat (joined: no store call may outlive the process group) and leave the group; a second
        call does nothing. Rank 0 hosts the job's store: it leaves last, once every other rank left or stopped
        beating (at most ``start_timeout_s``; ``timeout_s`` once a collective failed: a hung peer never leaves), so
        no rank's teardown meets a store that is already gone (which aborts that process)."""
        global _GROUP
        if self.closed:
            return
        self.closed = True
        self._stop.set()
        self._thread.join(timeout=5 * self._interval + 1)
        if dist.is_initialized():
            dist.destroy_process_group()
        try:
            self._store.set(f"specswap/closed/{self.rank}", "1")
            if self.rank == 0:
                self._wait_closed()
        except Exception:  # a peer's store already gone: nothing left to wait for
            pass
        # release the store now (rank 0: its server and that server's thread), while the interpreter is whole;
        # held by the module's group until interpreter exit, its destruction there can abort the process. The
        # process groups hold it too (through their prefix stores), so they go with it.
        self._store = self.tp_group = self.dp_group = None
        if _GROUP is self:
            _GROUP = None

    def _wait_closed(self) -> None:
        began = time.monotonic()
        pending = {r: (None, began) for r in range(1, self.world_size)}  # rank: (beat, since)
        said = False
        limit = self.timeout_s if self.broken else self.start_timeout_s
        while pending and time.monotonic() - began < limit:
            now = time.monotonic()
            for rank in sorted(pending):
                beat = self._read_beat(rank)
                if self._store.check([f"specswap/closed/{rank}"]):
                    del pending[rank]
                elif beat != pending[rank][0]:
                    pending[rank] = (beat, now)
                elif now - pending[rank][1] > self._silent_for():  # gone without leaving: not waited for
                    del pending[rank]
            if pending and not said and now - began > 2:
                print(f"specswap: rank 0 hosts the job's store: it waits for ranks {sorted(pending)} to leave",
                      flush=True)
                said = True
            time.sleep(0.01)


class _StoreGone(Exception):
    pass


_GROUP: DistributedGroup | None = None


def init_group(tp_size: int = 1, dp_size: int = 1, timeout_s: float | None = None,
               device: str | torch.device = "cpu", start_timeout_s: float | None = None,
               eager: bool = False) -> DistributedGroup:
    """Join (once per process) the job the launcher started, as ``dp_size`` x ``tp_size`` ranks.

    ``timeout_s`` (default ``SPECSWAP_DIST_TIMEOUT`` or 60): how long any collective may wait for a peer.
    ``start_timeout_s`` (default ``SPECSWAP_DIST_START_TIMEOUT`` or max(``timeout_s``, 600)): how long the start-up
    barrier (``wait_started``) and rank 0's exit wait for the others. ``eager`` (no CUDA graphs): on NCCL,
    ``TORCH_NCCL_BLOCKING_WAIT=1`` unless set, so a collective past the timeout raises in the waiting thread (named,
    ``RankFailure``) rather than NCCL's watchdog ending the process (README, "Several processes"); a blocking wait
    is not set with graphs, whose capture it would poll. A second call returns the same group, and raises if asked
    for another layout. The group closes at interpreter exit if nobody closed it.
    """
    global _GROUP
    for name, value in (("tp_size", tp_size), ("dp_size", dp_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1; got {value!r}")
    if timeout_s is None:
        timeout_s = float(os.environ.get("SPECSWAP_DIST_TIMEOUT", DEFAULT_TIMEOUT_S))
    if start_timeout_s is None and os.environ.get("SPECSWAP_DIST_START_TIMEOUT"):
        start_timeout_s = float(os.environ["SPECSWAP_DIST_START_TIMEOUT"])
    for name, value in (("timeout", timeout_s), ("start-up timeout", start_timeout_s)):
        if value is not None and not value > 0:
            raise ValueError(f"the distributed {name} must be > 0 seconds; got {value!r}")
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
    if backend == "nccl" and eager:
        os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")  # read when the process group is made
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
    _GROUP = DistributedGroup(tp_size, dp_size, timeout_s, backend, store, rank, world_size, start_timeout_s)
    atexit.unregister(_close_at_exit)
    atexit.register(_close_at_exit)  # every exit path leaves while the interpreter is whole
    return _GROUP


def _close_at_exit() -> None:
    if _GROUP is not None:
        try:
            _GROUP.close()
        except Exception as error:  # noqa: BLE001 - exiting anyway: said, not raised
            print(f"specswap: closing the distributed group at exit failed: {error!r}", flush=True)


def current_group() -> DistributedGroup | None:
    return _GROUP
