"""The one loop that owns the engine: requests come in through a queue, token updates go out per request.

The engine is not thread-safe, so a single background thread calls every engine method. Handlers (on the
asyncio loop) call ``submit`` / ``abort``, which only put commands on a queue; the thread admits them,
runs ``engine.step()`` while anything is unfinished, and hands each request's updates back to the asyncio
loop with ``call_soon_threadsafe``. A snapshot of the engine's stats is refreshed by the thread so that
``/server_info`` and ``/metrics`` never touch the engine.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from specswap.sampling import SamplingParams


@dataclass
class Update:
    """One request's state after an engine step (or its rejection at admission)."""

    request_id: int | None
    text: str = ""
    num_tokens: int = 0
    prompt_tokens: int = 0
    finish_reason: str | None = None      # "length" | "stop" | "abort" | None while running
    error: str | None = None              # admission failed (bad prompt): a 400 for the client
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


@dataclass
class Counters:
    """Totals kept by the scheduler thread (read by the metrics collector)."""

    requests_finished: dict[str, int] = field(default_factory=dict)
    prompt_tokens: int = 0
    generated_tokens: int = 0


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

    # ---- called from the asyncio side ----------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._commands.put(("wake", None))
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    def submit(self, prompt, params: SamplingParams) -> asyncio.Queue:
        """Queue a request; its updates (``Update``) arrive on the returned asyncio queue, the first one
        carrying the request id (or an admission error)."""
        loop = asyncio.get_running_loop()
        submission = _Submission(prompt, params, loop, asyncio.Queue())
        self._commands.put(("add", submission))
        return submission.updates

    def pending(self) -> int:
        """Commands not yet taken by the thread (submitted requests count as waiting)."""
        return self._commands.qsize()

    def abort(self, request_id: int) -> None:
        self._commands.put(("abort", request_id))

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
            except ValueError as error:
                self._send(submission, Update(None, error=str(error)))
                return
            submission.request_id = request_id
            self._live[request_id] = submission
            prompt_tokens = len(engine.encode(submission.prompt))
            self.counters.prompt_tokens += prompt_tokens
            self._send(submission, Update(request_id, prompt_tokens=prompt_tokens))
        elif command == "abort":
            if payload in self._live:
                output = engine.abort(payload)
                if output is not None:
                    self._deliver(output)

    def _deliver(self, output, tier: int | None = None) -> None:
        """Pass a request's new state to its handler; ``tier`` is the tier its new rounds ran at."""
        submission = self._live.get(output.request_id)
        if submission is None:
            return
        tier = self.engine.current_steps if tier is None else tier
        new_rounds = output.accept_lengths[submission.seen_rounds:]
        if self.on_round is not None:
            for accepted in new_rounds:
                self.on_round(accepted, tier)
        submission.seen_rounds = len(output.accept_lengths)
        submission.proposed_drafts += tier * len(new_rounds)
        if output.finish_reason is not None:  # counted before the client hears of it
            del self._live[output.request_id]
            counts = self.counters.requests_finished
            counts[output.finish_reason] = counts.get(output.finish_reason, 0) + 1
            self.counters.generated_tokens += len(output.token_ids)
        self._send(submission, Update(output.request_id, output.text, len(output.token_ids),
                                      len(output.prompt_token_ids), output.finish_reason,
                                      token_ids=output.token_ids, accept_lengths=output.accept_lengths,
                                      proposed_drafts=submission.proposed_drafts))

    def _run(self) -> None:
        engine = self.engine
        last_snapshot = 0.0
        try:
            while not self._stop.is_set():
                block = not engine.has_unfinished()
                while True:
                    try:
                        command, payload = self._commands.get(block=block, timeout=self.idle_wait if block else None)
                    except queue.Empty:
                        break
                    self._handle(command, payload)
                    block = False
                finishing = False
                if engine.has_unfinished():
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
        except BaseException as error:  # noqa: BLE001 - reported to every waiting client, then re-raised
            self.error = error
            for submission in list(self._live.values()):
                self._send(submission, Update(submission.request_id, finish_reason="error", error=repr(error)))
            raise
