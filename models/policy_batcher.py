"""The policy server's scheduler: concurrent chat requests become batched generations on one model.

`PolicyBatcher.submit` runs in the request's thread: it refuses (400) a prompt over `max_prompt_chars` before
tokenising it, tokenises it on a request-side copy of the tokenizer under a lock (a fast HF tokenizer flips shared
state on every call, so concurrent encoding can read message text as special tokens), checks its token budget and
queues it. The scheduler never tokenises, so a flood of huge prompts costs it nothing. Each round waits up to
`batch_window_s` for the clients of the previous batch, drops disconnected jobs and those past `queue_timeout_s`
(503), then generates once for the oldest job and every queued job with its sampling settings (up to `max_batch`),
cutting each answer to its own budget: exact, as every row is sampled token by token independently. A generation
cannot be interrupted, so jobs whose prompt plus budget fit `short_lane_tokens` go to a second lane (its own thread,
queue, sampling stream and tokenizer copy; the same weights); `short_lane_tokens=0` keeps one lane.
"""

from __future__ import annotations

import bisect
import copy
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentgym_opsd.policies import PolicyOutput
from agentgym_opsd.records import ChatMessage

__all__ = ["MESSAGE_FRAMING_TOKENS", "PROMPT_CHARS_PER_TOKEN", "SHORT_LANE_TOKENS", "BatchPolicy", "Completion", "Job",
           "JobError", "PolicyBatcher", "QueueFull", "prompt_chars"]

log = logging.getLogger(__name__)

_UNKNOWN_CLIENT_STATUS = 499  # nginx's "client closed request": written into a socket nobody reads

# Prompts are refused by size before they are tokenised, because tokenising costs time in proportion to the
# text: without this bound, prompts of a megabyte each would be tokenised only to be refused by the token limit. The
# bound is the token limit (`max_prompt_tokens`, or the model's context when smaller) times
# PROMPT_CHARS_PER_TOKEN characters. A token averages about 4 characters of English text and under 2 of
# random letters; 16 is generous: only long runs of one character (SmolLM2 has a token of 81 spaces) go
# past it, and the policy server's `--prompt-chars-per-token` raises it. Each message also counts as
# MESSAGE_FRAMING_TOKENS tokens' worth of characters for what the chat template adds around it (ChatML:
# `<|im_start|>`, the role, a newline, `<|im_end|>`): tokenising costs per message as well, so thousands of
# empty messages are refused like a megabyte of text.
PROMPT_CHARS_PER_TOKEN = 16.0
MESSAGE_FRAMING_TOKENS = 4

SHORT_LANE_TOKENS = 1024
"""Requests whose prompt plus budget is at most this many tokens are generated in the short lane (module
docstring): an agent turn's prompt of a few hundred tokens and its answer fit, a long document does not."""


class BatchPolicy(Protocol):
    """What the scheduler needs from a policy (`HFPolicy` has all of it). `prompt_ids` may use the policy's
    `tokenizer` and nothing else that changes: request threads call it on a shallow copy of the policy
    that holds a deep copy of the tokenizer."""

    tokenizer: Any  # `.decode(ids, skip_special_tokens=False)` cuts an answer to a shorter budget
    temperature: float
    top_p: float
    max_new_tokens: int

    def set_temperature(self, temperature: float) -> None: ...

    def with_sampling(self, *, temperature: float, seed: int) -> Any:
        """A policy over the same weights with a sampling stream of its own (the short lane's)."""
        ...

    def prompt_ids(self, messages: Sequence[ChatMessage]) -> list[int]: ...

    def generate_ids(self, prompts: Sequence[Sequence[int]]) -> list[PolicyOutput]: ...


class QueueFull(RuntimeError):
    """The queue holds `max_queue` jobs already; answered 503."""


class JobError(Exception):
    """A job answered with an HTTP error instead of a completion."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind


@dataclass
class Completion:
    """One answer in OpenAI's terms: `finish_reason` is "stop" (closing tag, end-of-sequence or a client
    stop string) or "length" (the request's budget ran out)."""

    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int


def _always_alive() -> bool:
    return True


@dataclass(eq=False)
class Job:
    """One chat request. `max_tokens` None means the server's default budget (shrunk to fit the context);
    `client_alive` says whether the client is still connected (checked before the job is generated).
    `submit` sets `prompt_ids` and `budget` (the answer's token budget) before the job is queued."""

    messages: list[ChatMessage]
    temperature: float
    top_p: float
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    client_alive: Callable[[], bool] = _always_alive
    prompt_ids: list[int] = field(default_factory=list)
    budget: int = 0
    enqueued_at: float = field(default_factory=time.monotonic)
    started: bool = False
    result: Completion | None = None
    error: JobError | None = None
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def sampling_key(self) -> tuple[float, float]:
        return (self.temperature, self.top_p if self.temperature > 0 else 1.0)

    def finish(self, result: Completion | None = None, error: JobError | None = None) -> None:
        self.result, self.error = result, error
        self.done.set()


def prompt_chars(messages: Sequence[ChatMessage], chars_per_token: float = PROMPT_CHARS_PER_TOKEN) -> int:
    """The size of a prompt as the limit before tokenising counts it: its roles' and contents' characters,
    plus MESSAGE_FRAMING_TOKENS tokens' worth of characters a message (see PROMPT_CHARS_PER_TOKEN)."""
    framing = MESSAGE_FRAMING_TOKENS * chars_per_token
    return sum(len(m["role"]) + len(m["content"]) for m in messages) + math.ceil(framing * len(messages))


def _request_side_policy(policy: BatchPolicy) -> BatchPolicy:
    """The policy as request threads tokenise with it: a shallow copy (no copy of the weights) holding a deep
    copy of the tokenizer, so tokenising a prompt never touches the tokenizer the scheduler decodes with."""
    view = copy.copy(policy)
    view.tokenizer = copy.deepcopy(policy.tokenizer)
    return view


def _lane_policy(policy: BatchPolicy, seed: int) -> BatchPolicy:
    """A second lane's view of `policy`: the same weights, its own sampling stream and its own copy of the
    tokenizer (each lane sets the temperature, top_p and budget of its batches and decodes on its own)."""
    view = policy.with_sampling(temperature=policy.temperature, seed=seed)
    view.tokenizer = copy.deepcopy(policy.tokenizer)
    return view  # type: ignore[no-any-return]


@dataclass(eq=False)
class _Lane:
    """A scheduler thread with its queue and its view of the policy; it takes the jobs whose prompt plus
    budget is at most `max_work_tokens` tokens (None: any job no other lane takes)."""

    name: str
    policy: BatchPolicy
    max_work_tokens: int | None
    queue: deque[Job] = field(default_factory=deque)
    expected: int = 1  # jobs the next round waits for: those in flight when the last generation ended
    thread: threading.Thread | None = None


class PolicyBatcher:
    """Queue + scheduler thread around one policy; see the module docstring. `close()` stops the thread and
    answers every queued job 503."""

    def __init__(
        self,
        policy: BatchPolicy,
        *,
        default_max_tokens: int,
        max_tokens_cap: int,
        max_prompt_tokens: int,
        context_tokens: int | None = None,
        max_batch: int = 16,
        max_queue: int = 64,
        queue_timeout_s: float = 60.0,
        batch_window_s: float = 0.02,
        poll_s: float = 0.1,
        prompt_chars_per_token: float = PROMPT_CHARS_PER_TOKEN,
        short_lane_tokens: int = SHORT_LANE_TOKENS,
        short_lane_seed: int = 1,
    ) -> None:
        if not 1 <= default_max_tokens <= max_tokens_cap:
            raise ValueError(f"the default max_tokens ({default_max_tokens}) must be in 1..max_tokens_cap "
                             f"({max_tokens_cap})")
        if min(max_prompt_tokens, max_batch, max_queue) < 1 or not queue_timeout_s > 0:
            raise ValueError("max_prompt_tokens, max_batch, max_queue and queue_timeout_s must be positive")
        if not 0 < prompt_chars_per_token < math.inf:
            raise ValueError(f"prompt_chars_per_token must be a finite number > 0, got {prompt_chars_per_token}")
        if short_lane_tokens < 0:
            raise ValueError(f"short_lane_tokens must be >= 0 (0 = one lane), got {short_lane_tokens}")
        self.policy = policy
        self.default_max_tokens = default_max_tokens
        self.max_tokens_cap = max_tokens_cap
        self.max_prompt_tokens = max_prompt_tokens
        self.context_tokens = context_tokens
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.queue_timeout_s = queue_timeout_s
        self.batch_window_s = batch_window_s
        self.poll_s = poll_s
        self.prompt_chars_per_token = prompt_chars_per_token
        self.prompt_token_limit = max_prompt_tokens if context_tokens is None else min(max_prompt_tokens, context_tokens)
        self.max_prompt_chars = int(self.prompt_token_limit * prompt_chars_per_token)  # as `prompt_chars` counts
        self._tokenizing = _request_side_policy(policy)  # used by request threads only, under _tokenizing_lock
        self._tokenizing_lock = threading.Lock()
        self.batch_sizes: list[int] = []  # jobs per generation, for /health and the tests
        self.dropped_disconnected = 0
        self._cond = threading.Condition()  # guards every lane's queue and `expected`
        self._closed = False
        self._lanes = [_Lane("policy-batcher", policy, None)]
        if short_lane_tokens:
            self._lanes.insert(0, _Lane("policy-batcher-short", _lane_policy(policy, short_lane_seed),
                                        short_lane_tokens))
        for lane in self._lanes:
            lane.thread = threading.Thread(target=self._loop, args=(lane,), name=lane.name, daemon=True)
            lane.thread.start()

    @property
    def thread_names(self) -> list[str]:
        """The scheduler threads' names, one a lane (the short lane's first when there is one)."""
        return [lane.name for lane in self._lanes]

    # -- request threads ----------------------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        """In the calling (request) thread: refuse a prompt too long to tokenise, tokenise it and check its
        budget (JobError 400 when refused, 500 when tokenising fails), then queue `job` with its token ids.
        Raises QueueFull when `max_queue` jobs are waiting already (checked before tokenising too)."""
        with self._cond:
            self._refuse_if_full()
        job.prompt_ids = self._tokenise(job.messages)
        job.budget = self._budget(job, len(job.prompt_ids))
        work_tokens = len(job.prompt_ids) + job.budget
        lane = next(lane for lane in self._lanes if lane.max_work_tokens is None or work_tokens <= lane.max_work_tokens)
        with self._cond:
            self._refuse_if_full()
            job.enqueued_at = time.monotonic()
            lane.queue.append(job)
            self._cond.notify_all()

    def wait(self, job: Job) -> Completion:
        """Block until `job` is answered; raises JobError for refusals, timeouts and disconnected clients.
        While the job is queued, every `poll_s` the client's connection is checked (a closed one takes the
        job out of the queue) and so is the queue timeout; once generation started it is waited for."""
        while not job.done.wait(self.poll_s):
            if job.started:
                continue
            if not job.client_alive():
                if self._withdraw(job):
                    with self._cond:
                        self.dropped_disconnected += 1
                    raise JobError(_UNKNOWN_CLIENT_STATUS, "the client closed the connection")
            elif time.monotonic() - job.enqueued_at > self.queue_timeout_s and self._withdraw(job):
                raise _queue_timeout(self.queue_timeout_s)
        if job.error is not None:
            raise job.error
        assert job.result is not None
        return job.result

    def queued(self) -> int:
        """Jobs waiting in all lanes."""
        with self._cond:
            return self._queued()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            pending = [job for lane in self._lanes for job in lane.queue]
            for lane in self._lanes:
                lane.queue.clear()
            self._cond.notify_all()
        for job in pending:
            job.finish(error=JobError(503, "the server is shutting down", "server_error"))
        for lane in self._lanes:
            assert lane.thread is not None
            lane.thread.join(timeout=30)

    def _queued(self) -> int:
        return sum(len(lane.queue) for lane in self._lanes)

    def _refuse_if_full(self) -> None:
        if self._closed:
            raise QueueFull("the server is shutting down")
        if (queued := self._queued()) >= self.max_queue:
            raise QueueFull(f"{queued} requests are queued already (the limit is {self.max_queue}); retry later")

    def _tokenise(self, messages: list[ChatMessage]) -> list[int]:
        """The prompt's token ids, tokenised on the request side's own tokenizer; a prompt with more than
        `max_prompt_chars` characters is refused (400) without being tokenised."""
        size = prompt_chars(messages, self.prompt_chars_per_token)
        if size > self.max_prompt_chars:
            framing = MESSAGE_FRAMING_TOKENS * self.prompt_chars_per_token
            raise _Refused(f"the prompt is too long to tokenise: {size} characters, counting {framing:g} a message "
                           f"for its template ({len(messages)} messages), where at most {self.max_prompt_chars} are "
                           f"accepted ({self.prompt_token_limit} prompt tokens x {self.prompt_chars_per_token:g} "
                           f"characters a token)")
        try:
            with self._tokenizing_lock:
                return list(self._tokenizing.prompt_ids(messages))
        except ValueError as exc:  # an unknown role, say: this client's mistake
            raise JobError(400, str(exc)) from None
        except Exception as exc:
            log.exception("tokenising a prompt failed")
            raise JobError(500, f"tokenising the prompt failed: {type(exc).__name__}", "server_error") from None

    def _budget(self, job: Job, prompt_tokens: int) -> int:
        """The job's token budget; raises _Refused (400) when its prompt or its total does not fit."""
        if prompt_tokens > self.max_prompt_tokens:
            raise _Refused(f"the prompt is {prompt_tokens} tokens; this server accepts at most "
                           f"{self.max_prompt_tokens}")
        room = None if self.context_tokens is None else self.context_tokens - prompt_tokens
        if job.max_tokens is not None:
            if room is not None and job.max_tokens > room:
                raise _Refused(f"this model's context is {self.context_tokens} tokens; the prompt ({prompt_tokens})"
                               f" plus max_tokens ({job.max_tokens}) exceed it")
            return job.max_tokens
        if room is not None and room < 1:
            raise _Refused(f"the prompt ({prompt_tokens} tokens) fills this model's context "
                           f"({self.context_tokens} tokens)")
        return self.default_max_tokens if room is None else min(self.default_max_tokens, room)

    def _withdraw(self, job: Job) -> bool:
        """Take `job` out of the queue unless the scheduler has taken it already."""
        with self._cond:
            if job.started:
                return False
            for lane in self._lanes:
                if job in lane.queue:
                    lane.queue.remove(job)
                    return True
            return False

    # -- scheduler thread ---------------------------------------------------------------------------------

    def _loop(self, lane: _Lane) -> None:
        while True:
            with self._cond:
                while not lane.queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                deadline = time.monotonic() + self.batch_window_s
                target = min(self.max_batch, lane.expected)
                while len(lane.queue) < target and (left := deadline - time.monotonic()) > 0:
                    self._cond.wait(left)
                group = self._take_group(lane)
            if group:
                try:
                    self._run(lane, group)
                except Exception as exc:  # the scheduler must outlive any one batch
                    log.exception("generation failed")
                    for job in group:
                        if not job.done.is_set():
                            job.finish(error=JobError(500, f"generation failed: {type(exc).__name__}",
                                                      "server_error"))

    def _take_group(self, lane: _Lane) -> list[Job]:
        """Under the lock: drop the lane's gone and expired jobs, then take the oldest job's sampling group."""
        now = time.monotonic()
        waiting: deque[Job] = deque()
        for job in lane.queue:
            if not job.client_alive():
                self.dropped_disconnected += 1
                job.finish(error=JobError(_UNKNOWN_CLIENT_STATUS, "the client closed the connection"))
            elif now - job.enqueued_at > self.queue_timeout_s:
                job.finish(error=_queue_timeout(self.queue_timeout_s))
            else:
                waiting.append(job)
        group: list[Job] = []
        rest: deque[Job] = deque()
        for job in waiting:
            if len(group) < self.max_batch and (not group or job.sampling_key == group[0].sampling_key):
                job.started = True
                group.append(job)
            else:
                rest.append(job)
        lane.queue = rest
        return group

    def _run(self, lane: _Lane, group: list[Job]) -> None:
        """Generate for `group` on the lane's policy: jobs `submit` tokenised and checked, all with the same
        sampling settings."""
        self.batch_sizes.append(len(group))
        policy = lane.policy
        temperature, top_p = group[0].sampling_key
        policy.set_temperature(temperature)
        policy.top_p = top_p
        policy.max_new_tokens = max(job.budget for job in group)
        outputs = policy.generate_ids([job.prompt_ids for job in group])
        with self._cond:  # counted before any answer goes out, so no client is counted twice
            lane.expected = len(group) + len(lane.queue)
        for job, out in zip(group, outputs, strict=True):
            job.finish(self._completion(policy, out, job.budget, job.stop, len(job.prompt_ids)))

    def _completion(self, policy: BatchPolicy, out: PolicyOutput, budget: int, stops: Sequence[str],
                    prompt_tokens: int) -> Completion:
        ids, text, reason = out.token_ids, out.text, out.finish_reason
        if len(ids) > budget:  # generated for a longer budget in the same batch: the prefix is this answer
            ids, reason = ids[:budget], "length"
            text = _decode(policy, ids)
        cut = _first_stop(text, stops)
        if cut is not None:
            return Completion(text[:cut], "stop", prompt_tokens, _tokens_through_stop(policy, ids, stops))
        return Completion(text, "length" if reason == "length" else "stop", prompt_tokens, len(ids))


def _decode(policy: BatchPolicy, ids: Sequence[int]) -> str:
    return str(policy.tokenizer.decode(list(ids), skip_special_tokens=False))


def _tokens_through_stop(policy: BatchPolicy, ids: list[int], stops: Sequence[str]) -> int:
    """The fewest leading tokens whose text holds a client stop string: what OpenAI counts as generated when it
    stops there (found by bisection, as holding a stop only grows with the prefix)."""
    def holds_stop(k: int) -> bool:
        return _first_stop(_decode(policy, ids[:k]), stops) is not None

    return min(bisect.bisect_left(range(len(ids) + 1), True, key=holds_stop), len(ids))


class _Refused(JobError):
    """A prompt the limits refuse (400)."""

    def __init__(self, message: str) -> None:
        super().__init__(400, message)


def _queue_timeout(seconds: float) -> JobError:
    return JobError(503, f"the request waited more than {seconds:g} s in the queue; retry later", "server_error")


def _first_stop(text: str, stops: Sequence[str]) -> int | None:
    cuts = [i for s in stops if (i := text.find(s)) >= 0]
    return min(cuts) if cuts else None
