"""The engine across ranks: what ``Engine(..., tp_size=N, dp_size=M)`` adds to one process's engine.

- Start-up: join the process group (``group.init_group``), check that every rank has the same configuration
  (``config_check``), shard the target (``tensor_parallel``). Each rank captures its own graphs: the forwards'
  collectives are functional (dispatcher operators), which a CPU tape or CUDA graph records and replays.
- Each step, in a tensor-parallel group: its first rank (the leader) owns the requests. It broadcasts what
  changed since the last step (new requests with their prompts, sampling settings and generator seeds, and
  aborts); the other ranks (followers, ``Engine.follow()``) apply the same changes, so every rank's scheduler
  makes the same choices (slots, prefill groups, batch) and computes the same tokens from the same logits.
- Each step, on every rank (with an adaptive policy): the agreement (``agreement.AgreedController``), one
  all-gather, after which every rank's policy has seen the same observation and switched alike.
- Start-up ends with a barrier after every rank built its graphs (``started``: its own, longer timeout; a rank
  that failed is named). Shut-down (``stop``): with the agreement, a leader steps on (idle) saying it stops,
  until every data-parallel leader says so; every rank then leaves after that same step, so no rank is left
  waiting in a collective. Without it, a leader tells its tensor-parallel followers (one broadcast); data-parallel
  groups then share no step. Each rank closes its group after (``close``).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

from specswap.distributed.group import AGREE, BEGIN, FORWARD, DistributedGroup

__all__ = ["Lockstep", "Stopped", "join"]


def join(tp_size: int, dp_size: int, timeout_s: float | None, device, eager: bool = False) -> DistributedGroup:
    """This process's group (``group.init_group``)."""
    from specswap.distributed.group import init_group
    return init_group(tp_size, dp_size, timeout_s, device, eager=eager)


class Stopped(Exception):
    """The leader shut the engine down (``Engine.shutdown()``): a follower's ``follow()`` returns."""


@dataclass
class _Message:
    requests: list[tuple[int, list[int], object, int | None]] = field(default_factory=list)  # id, prompt, params, seed
    aborts: list[int] = field(default_factory=list)
    stop: bool = False
    checksum: int = 0  # the leader's rounds so far (``Lockstep._rounds_hash``)


class Lockstep:
    """One engine's part in the job: the group, the leader's announcements and the agreement (if adaptive)."""

    def __init__(self, group: DistributedGroup):
        self.group = group
        self.leader = group.tp_rank == 0
        self._announced: set[int] = set()
        self._aborts: list[int] = []
        self.agreement = None  # an AgreedController when the engine adapts
        self._rounds_hash = 0  # the tokens of every round so far (tensor-parallel ranks compare it each step)
        self._eager = True  # whether the worker runs eagerly (``prepare``)
        self.stopping = False  # this group's leader shuts down (``stop``)

    def prepare(self, engine, *, tiers, start_tier: int, adaptive_config, disable_graphs: bool,
                tp_draft: str | None = None) -> None:
        """Check every rank's configuration (one all-gather; ``ConfigMismatch`` names a difference), then shard the
        engine's target (and its draft at ``tp_draft="shard"``)."""
        from specswap.distributed.config_check import check_same_config, engine_fingerprint
        from specswap.distributed.tensor_parallel import shard_draft, shard_target
        group = self.group
        group.enter(AGREE)  # start-up's agreement: a rank still loading is behind it
        check_same_config(group, engine_fingerprint(
            candidate_tiers=tiers, start_tier=start_tier, algorithm=engine.speculative_algorithm,
            target=engine.target, draft=engine.draft, weights=engine.weights, max_batch_size=engine.max_batch_size,
            max_seq_len=engine.max_seq_len, adaptive_config=adaptive_config, tp_size=group.tp_size,
            dp_size=group.dp_size, graphs=not disable_graphs, tp_draft=tp_draft))
        self._eager = disable_graphs
        if group.tp_size == 1:
            return
        engine.target = shard_target(engine.target, group)
        if tp_draft == "shard":
            engine.draft = shard_draft(engine.draft, group)

    def attach(self, worker, tp_draft: str | None) -> None:
        """NGRAM at ``tp_draft="leader"``: the group's first rank looks up, one broadcast a drafting round carries
        its drafts to the others (``NgramDrafter.lookup_on_leader``)."""
        if self.group.tp_size > 1 and tp_draft == "leader":
            worker.drafter.lookup_on_leader(self.group.broadcast, self.leader)

    def agree(self, controller, worker, min_dwell_rounds: int | None):
        """``controller`` fed by the per-step agreement (``agreement.AgreedController``)."""
        from specswap.distributed.agreement import DEFAULT_MIN_DWELL_ROUNDS, AgreedController
        self.agreement = AgreedController(controller, self.group, worker.max_steps,
                                          DEFAULT_MIN_DWELL_ROUNDS if min_dwell_rounds is None else min_dwell_rounds)
        return self.agreement

    @contextlib.contextmanager
    def starting(self, engine, tp_draft: str | None):
        """Around the build of ``engine``'s worker (its graph capture): the start-up barrier after it, with its own
        timeout (``DistributedGroup.wait_started``; a failure in it is posted for the other ranks, who name this
        one, and raised here), then ``attach``."""
        try:
            yield
        except BaseException as error:
            self.group.wait_started(error)
            raise
        self.group.wait_started()
        self.attach(engine.worker, tp_draft)
        self._head = getattr(engine.target, "lm_head", None)  # the (sharded) head begin_step sets greedy_only on

    def forward(self, fn, *args):
        """``fn(*args)`` (a prefill or a round), counted in the heartbeat's position; in a tensor-parallel group, a
        failure inside it (a collective that a replayed graph ran) is diagnosed as a ``RankFailure`` naming the
        rank, as Python's are."""
        self.group.enter(FORWARD)
        return self.group.guard("forward", fn, *args) if self.group.tp_size > 1 else fn(*args)

    # ---- the leader's announcements (tensor-parallel groups) --------------------------------------------

    def note_abort(self, request_id: int) -> None:
        if self.group.tp_size > 1 and request_id in self._announced:
            self._aborts.append(request_id)

    def begin_step(self, batch) -> None:
        """Leader: broadcast the changes to its ``batch`` (``batch.RequestBatch``) since the last step (and a checksum
        of its tokens so far); follower: apply them (``Stopped`` on shutdown), after checking its tokens against the
        leader's checksum."""
        self.group.enter(BEGIN)
        if self.group.tp_size == 1:
            return
        try:
            self._step(batch)
        finally:
            head = getattr(self, "_head", None)
            # eager, every request greedy: the LM head gathers an argmax, not the row (a graph records the row's
            # gather once, at capture, for greedy and sampled rounds alike)
            if self._eager and hasattr(head, "greedy_only"):
                head.greedy_only = all(r.params.greedy for r in (*batch.waiting, *batch.running))

    def _step(self, batch) -> None:
        if self.leader:
            message = _Message(aborts=self._aborts, checksum=self._rounds_hash)
            for request in batch.waiting:
                if request.request_id not in self._announced:
                    seed = request.generator.initial_seed() if request.generator is not None else None
                    message.requests.append((request.request_id, request.prompt_ids, request.params, seed))
                    self._announced.add(request.request_id)
            self._aborts = []
            self.group.broadcast_object(message)
            return
        message = self.group.broadcast_object(None)
        if message.stop:
            raise Stopped()
        if message.checksum != self._rounds_hash:
            raise RuntimeError(f"rank {self.group.rank}: its tokens differ from its tensor-parallel leader's (rank "
                               f"{self.group.tp_ranks[0]}): the ranks' forwards are not deterministic alike")
        for request_id in message.aborts:
            batch.abort(request_id)
        for request_id, prompt_ids, params, seed in message.requests:  # checked by the leader
            request = batch.make_request(prompt_ids, params, request_id)
            if seed is not None:
                request.generator.manual_seed(seed)
            batch.enqueue([request])

    def stop(self, batch) -> None:
        """Leader: end this group's steps, so that no rank is left waiting in a collective. With the agreement,
        step on (idle, requests still running go on) saying so until every data-parallel leader does; every rank
        leaves after that step (``finished``). Without it, tell the tensor-parallel followers (one broadcast).
        Nothing once a collective failed (its ``RankFailure`` already ended the job)."""
        group = self.group
        if not self.leader or group.broken or group.closed:
            return
        if self.agreement is None:
            if group.tp_size > 1:
                group.broadcast_object(_Message(stop=True))
            return
        self.stopping = True
        began, said = time.monotonic(), False
        while not self.finished:
            batch.step()
            if not batch.busy and not self.finished:
                if not said and time.monotonic() - began > 2:
                    print(f"specswap: rank {group.rank} shuts down once every data-parallel leader does; it steps "
                          f"(idle) until then", flush=True)
                    said = True
                time.sleep(0.01)

    @property
    def finished(self) -> bool:
        """Whether every leader shut down (the agreement said so at this step): every rank leaves now."""
        return self.agreement is not None and self.agreement.stopped

    def close(self) -> None:
        self.group.close()

    # ---- the agreement (every rank, every step) ----------------------------------------------------

    def end_step(self, result, busy: bool) -> None:
        if result is not None and self.group.tp_size > 1:  # every round's tokens, hashed alike on every rank
            self._rounds_hash = hash((self._rounds_hash, *map(tuple, result.new_tokens)))
        if self.agreement is not None:
            self.group.enter(AGREE)
            self.agreement.end_step(result, busy, self.stopping)

    @property
    def lockstep_steps(self) -> bool:
        """Whether the ranks' steps are collective (a tensor-parallel group, or the agreement)."""
        return self.group.tp_size > 1 or self.agreement is not None

    @property
    def peers_busy(self) -> bool:
        """Whether some rank had unfinished requests after the last step (True before the first)."""
        return self.agreement is not None and self.agreement.peers_busy
