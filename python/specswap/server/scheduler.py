"""The one loop that owns the engine: requests come in through a queue, token updates go out per request.

The engine is not thread-safe, so a single background thread calls every engine method. Handlers (on the
asyncio loop) call ``submit`` / ``abort``, which only put commands on a queue; the thread admits them,
runs ``engine.step()`` while anything is unfinished, and hands each request's updates back to the asyncio
loop with ``call_soon_threadsafe``. A snapshot of the engine's stats is refreshed by the thread so that
``/server_info`` and ``/metrics`` never touch the engine.

Admission is bounded: ``reserve`` counts a request from submission until its final update (queued and running
alike), so the server can answer 503 past ``--max-running-requests + --max-queued-requests``. A request with a
deadline is aborted by the thread once it passes (finish reason "timeout"); ``abort_all`` ends every request
(the drain's "shutdown").
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from specswap.sampling import SamplingParams
from specswap.tier import Tier

logger = logging.getLogger(__name__)


@dataclass
class Update:
    """One request's state after an engine step (or its rejection at admission)."""

    request_id: int | None
    text: str = ""
    num_tokens: int = 0
    prompt_tokens: int = 0
    finish_reason: str | None = None      # "length" | "stop" | "abort" | "timeout" | "shutdown" | "error" | None
    error: str | None = None              # admission failed (a 400), or the engine loop died (a 500 for everyone)
    abort_message: str | None = None      # why it ended early: abort, timeout, shutdown, or its own fault ("error")
    token_ids: list[int] = field(default_factory=list)       # generated so far
    accept_lengths: list[int] = field(default_factory=list)  # accepted drafts per verify round
    proposed_drafts: int = 0              # drafts verified for this request (the tier of each of its rounds)


@dataclass
class _Submission:
    prompt: Any                           # str or list of token ids
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    updates: asyncio.Queue
    request_id: int | None = None
    seen_rounds: int = 0
    proposed_drafts: int = 0
    deadline: float | None = None         # time.monotonic() past which the thread aborts it ("timeout")
    timeout: float | None = None          # the deadline's length in seconds, for the message
    reserved: bool = True                 # counted by reserve() until it ends (health probes are not)
    counted: bool = True                  # in requests_finished and the metrics (health probes are not)


@dataclass
class Counters:
    """Totals kept by the scheduler thread (read by the metrics collector)."""

    requests_finished: dict[str, int] = field(default_factory=dict)
    prompt_tokens: int = 0
    generated_tokens: int = 0
    speculation_disabled: int = 0         # admitted requests with disable_speculative_decoding


class Scheduler:
    """Owns ``engine`` on one thread. ``on_round(accepted, tier)`` is called per request per verify round (for
    metrics); ``idle_wait`` bounds how long the idle thread sleeps on its queue."""

    def __init__(self, engine, on_round=None, idle_wait: float = 0.05):
        self.engine = engine
        self.on_round = on_round
        self.idle_wait = idle_wait
        self.counters = Counters()
        self._commands: queue.Queue = queue.Queue()
        self._live: dict[int, _Submission] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="specswap-scheduler", daemon=True)
        self.snapshot: dict[str, Any] = engine.stats()
        self.error: BaseException | None = None
        self.died_at: float | None = None     # time.monotonic() when the engine loop died (the server then exits)
        self._lock = threading.Lock()
        self._inflight = 0                    # reserved requests not yet finished (queued, waiting or running)
        self.last_loop = time.monotonic()     # when the thread last went round its loop (health_generate)

    # ---- called from the asyncio side ----------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = None) -> bool:
        """End the thread's loop and join it, at most ``timeout`` seconds (None: until it is gone; a distributed
        engine's step ends within its collectives' timeout). Returns whether it is gone: only then may another
        thread touch the engine (``Engine.shutdown``)."""
        self._stop.set()
        self._commands.put(("wake", None))
        if self._thread.ident is not None:  # started
            self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    @property
    def inflight(self) -> int:
        """Reserved requests that have not finished: queued, waiting for a slot or running."""
        return self._inflight

    def reserve(self, count: int, capacity: int) -> bool:
        """Count ``count`` new requests in if at most ``capacity`` would then be in flight; False (nothing
        counted) otherwise. Each reserved request must then be submitted (it is released when it ends)."""
        with self._lock:
            if self._inflight + count > capacity:
                return False
            self._inflight += count
            return True

    def _release(self, submission: _Submission) -> None:
        if submission.reserved:
            submission.reserved = False
            with self._lock:
                self._inflight -= 1

    def submit(self, prompt, params: SamplingParams, timeout: float | None = None, arrived: float | None = None,
               reserved: bool = True, counted: bool = True) -> asyncio.Queue:
        """Queue a request (``reserved``: one ``reserve`` counted for it); its updates (``Update``) arrive on the
        returned asyncio queue, the first one carrying the request id (or an admission error). ``timeout``
        seconds after ``arrived`` (time.monotonic(); default now) the thread aborts it with reason "timeout"."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else (time.monotonic() if arrived is None else arrived) + timeout
        submission = _Submission(prompt, params, loop, asyncio.Queue(), deadline=deadline, timeout=timeout,
                                 reserved=reserved, counted=counted)
        if self.error is not None:  # the loop is gone: nobody would take the command
            self._release(submission)
            submission.updates.put_nowait(Update(None, finish_reason="error", error=repr(self.error)))
            return submission.updates
        self._commands.put(("add", submission))
        return submission.updates

    def call(self, fn) -> asyncio.Future:
        """Run ``fn(engine)`` on the scheduler thread between steps (a route never touches the engine itself); the
        returned future gets its result, or its exception (RuntimeError once the loop stopped or died)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if self.error is not None or self._stop.is_set():
            future.set_exception(RuntimeError("the engine loop is not running"))
        else:
            self._commands.put(("call", (fn, loop, future)))
        return future

    @staticmethod
    def _settle(loop: asyncio.AbstractEventLoop, future: asyncio.Future, result: Any = None,
                error: BaseException | None = None) -> None:
        def settle():
            if not future.done():  # the route may have gone (a cancelled request)
                future.set_result(result) if error is None else future.set_exception(error)
        try:
            loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the event loop is closed (shutdown): nobody is listening
            pass

    def pending(self) -> int:
        """Commands not yet taken by the thread (submitted requests count as waiting)."""
        return self._commands.qsize()

    def abort(self, request_id: int, reason: str = "abort", message: str | None = None) -> None:
        """End a request early; its final update carries ``reason`` ("abort", "timeout", "shutdown") and
        ``message``. A request that already finished is left as it is."""
        self._commands.put(("abort", (request_id, reason, message)))

    def abort_all(self, reason: str, message: str) -> None:
        """End every request submitted so far that has not finished."""
        self._commands.put(("abort_all", (reason, message)))

    # ---- the scheduler thread ------------------------------------------------------------------------

    def _send(self, submission: _Submission, update: Update) -> None:
        try:
            submission.loop.call_soon_threadsafe(submission.updates.put_nowait, update)
        except RuntimeError:  # the event loop is closed (shutdown): nobody is listening
            pass

    def _handle(self, command: str, payload) -> None:
        engine = self.engine
        if command == "add":
            submission: _Submission = payload
            try:
                request_id = engine.add_request(submission.prompt, submission.params)
            except Exception as error:  # noqa: BLE001 - a request the engine refuses is that request's 400
                self._release(submission)
                self._send(submission, Update(None, error=str(error) if isinstance(error, ValueError)
                                              else f"the request cannot be served: {type(error).__name__}: {error}"))
                return
            submission.request_id = request_id
            self._live[request_id] = submission
            prompt_tokens = len(engine.encode(submission.prompt))
            if submission.counted:
                self.counters.prompt_tokens += prompt_tokens
                if submission.params.disable_speculative_decoding:
                    self.counters.speculation_disabled += 1
            self._send(submission, Update(request_id, prompt_tokens=prompt_tokens))
        elif command == "abort":
            self._abort(*payload)
        elif command == "abort_all":
            for request_id in list(self._live):
                self._abort(request_id, *payload)
        elif command == "call":
            fn, loop, future = payload
            try:
                result = fn(engine)
            except Exception as error:  # noqa: BLE001 - the caller's to answer (the engine is unchanged)
                self._settle(loop, future, error=error)
            else:
                self.snapshot = engine.stats()  # a client that reads /server_info after the call's answer sees it
                self._settle(loop, future, result)

    def _abort(self, request_id: int, reason: str, message: str | None) -> None:
        if request_id in self._live:
            output = self.engine.abort(request_id)
            if output is not None:
                self._deliver(output, reason=reason, message=message)

    def _expire(self) -> None:
        """Abort every request past its deadline."""
        now = time.monotonic()
        for request_id, submission in list(self._live.items()):
            if submission.deadline is not None and now >= submission.deadline:
                self._abort(request_id, "timeout", f"the request passed its deadline of {submission.timeout:g} s "
                                                   f"(request_timeout)")

    def _deliver(self, output, tier: int | None = None, reason: str | None = None,
                 message: str | None = None) -> None:
        """Pass a request's new state to its handler; ``tier`` is the tier its new rounds ran at; an abort's
        ``reason`` replaces the engine's "abort"."""
        submission = self._live.get(output.request_id)
        if submission is None:
            return
        tier = self.engine.current_tier if tier is None else tier
        label = "0" if submission.params.disable_speculative_decoding else Tier.from_key(tier).label
        new_rounds = output.accept_lengths[submission.seen_rounds:]
        if self.on_round is not None and submission.counted:
            for accepted in new_rounds:  # a request with speculation off verified no drafts: no observation
                self.on_round(None if submission.params.disable_speculative_decoding else accepted, label)
        submission.seen_rounds = len(output.accept_lengths)
        submission.proposed_drafts = output.num_draft_tokens  # the engine's own count (a plain round drafts none)
        finish_reason = output.finish_reason
        if finish_reason == "abort":
            finish_reason = reason or "abort"
        if finish_reason == "error":  # a fault of this request's own (Engine._fail): it alone ends
            message = output.error
        if finish_reason is not None:  # counted before the client hears of it
            del self._live[output.request_id]
            self._release(submission)
            if submission.counted:
                counts = self.counters.requests_finished
                counts[finish_reason] = counts.get(finish_reason, 0) + 1
                self.counters.generated_tokens += len(output.token_ids)
        self._send(submission, Update(output.request_id, output.text, len(output.token_ids),
                                      len(output.prompt_token_ids), finish_reason,
                                      token_ids=output.token_ids, accept_lengths=output.accept_lengths,
                                      proposed_drafts=submission.proposed_drafts,
                                      abort_message=message if finish_reason in ("abort", "timeout", "shutdown",
                                                                                  "error") else None))

    def _run(self) -> None:
        engine = self.engine
        last_snapshot = 0.0
        try:
            while not self._stop.is_set():
                self.last_loop = time.monotonic()
                self._expire()
                block = not engine.has_unfinished()
                while True:
                    try:
                        command, payload = self._commands.get(block=block, timeout=self.idle_wait if block else None)
                    except queue.Empty:
                        break
                    self._handle(command, payload)
                    block = False
                finishing = False
                # a distributed engine steps when idle too: its peers' steps wait for this one (keepalive_due)
                if engine.has_unfinished() or engine.keepalive_due():
                    step = engine.step()
                    finishing = bool(step.finished)
                    if finishing:  # a client that reads /server_info after its answer sees this step's tier
                        self.snapshot = engine.stats()
                        last_snapshot = time.monotonic()
                    for output in step.outputs:
                        self._deliver(output, step.tier)
                now = time.monotonic()
                if not finishing and (now - last_snapshot > 0.05 or not engine.has_unfinished()):
                    self.snapshot = engine.stats()
                    last_snapshot = now
            for command in self._fail_calls(self._drain_commands()):  # the calls answered, the rest left as they were
                self._commands.put(command)
        except BaseException as error:  # noqa: BLE001 - reported to every waiting client, then re-raised
            self.error = error
            self.died_at = time.monotonic()
            commands = self._drain_commands()
            self._fail_calls(commands)
            waiting = [payload for command, payload in commands if command == "add"]
            for submission in [*self._live.values(), *waiting]:
                self._release(submission)  # a drain does not wait for requests a dead engine cannot finish
                self._send(submission, Update(submission.request_id, finish_reason="error", error=repr(error)))
            self._live.clear()
            logger.critical("specswap serve: the engine failed in shared state (a forward, a graph replay, the "
                            "pool); every in-flight request got a 500 and the server exits", exc_info=error)

    def _fail_calls(self, commands: list) -> list:
        """Answer the ``call`` commands the stopped loop will never run; returns the other commands."""
        for command, payload in commands:
            if command == "call":
                self._settle(payload[1], payload[2], error=RuntimeError("the engine loop stopped"))
        return [(command, payload) for command, payload in commands if command != "call"]

    def _drain_commands(self) -> list:
        commands = []
        while True:
            try:
                commands.append(self._commands.get_nowait())
            except queue.Empty:
                return commands
