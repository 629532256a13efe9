"""Soak: the WebShop site server and the Search-QA retrieval server under concurrent agent traffic for minutes,
with their memory watched (prints a rich table; writes JSON).

    python benchmarks/bench_soak.py                          # 32 clients, 10 minutes per server
    python benchmarks/bench_soak.py --minutes 2 --servers webshop
    python benchmarks/bench_soak.py --json benchmarks/results/soak.json --note "shared with a training run"

Each server is started through its own command line, in a process of its own, one after the other:
`python -m agentgym_opsd.environments.webshop.serve --port 0` on the generated catalogue
(`--num-products`, 2,000 by default, as the server's own default), and `search_qa.serve --index IDX --port 0`
on the `tiny` generated world (133 passages) indexed with the hashing encoder, which the child process puts
in place of the MiniLM default before the CLI runs (no model: what is soaked is the server, not the encoder).

`--clients` threads then play for `--minutes`, back to back (`--think-ms` between requests, 0 by default):

* WebShop: the episode API an agent drives: `POST /api/sessions` (a random training goal), then up to
  `--max-steps` `POST /api/sessions/<sid>/step` with what an agent does: `search[...]` with words of the
  instruction on the search page, clicks on result ids, `next >`, options, `< prev`, `buy now` (weighted, from
  the admissible actions the last reply listed), an invalid action now and then (~3%, answered 200 with
  `valid: false`), a `GET /s/<sid>/state.json` on ~10% of the steps (the browser adapter's oracle reads it),
  and `DELETE /api/sessions/<sid>` at the end.
* Search-QA: `POST /retrieve` with 1-3 queries (questions, hop queries such as "X worked for", titles), topk
  3, `return_scores`, as the environment sends them.

Two loads measure what slow or long requests cost a short one (issue 35); their result records the short
request's latency (p50 / p99 / max) under `latency_ms_by_kind`:

* `search_qa_slow`: the retrieval server as above while `--slow-clients` (64, twice its 32 workers)
  connections hold it without finishing a request: half send nothing, half trickle a request head a byte a
  second, each opened again once the server closes it (a 408 after its head timeout). The `--clients`
  agents' one-to-three-query requests are the short ones (kind `retrieve`).
* `policy_mixed`: the policy server (`python -m agentgym_opsd.models.policy_server --policy-model`,
  tiny-random by default) with `--long-clients` (3) clients sending ~3,900-token prompts (max_tokens 64,
  greedy) back to back and `--short-clients` (2) sending a short greedy request (max_tokens 16) after each
  answer, with `--think-ms` between (kinds `long` and `short`).

`--attack` measures instead what idle and trickling clients cost each server we ship (tests/server_targets.TARGETS:
retrieval, WebShop, policy, OpenEnv, each through its CLI with its default limits): `--idle` (50) connections
that send nothing and `--trickling` (10) that trickle a request head a byte every 1.5 s are held open (each
opened again once the server answers it), and `--attack-requests` (20) normal requests are timed one after
another meanwhile. The table gives per server the connections held when the requests began, the normal
request's latency (p50 / max) and the requests lost (any reply but 200); it goes under "attack" in the JSON,
whose other content is kept.

An error is any reply other than HTTP 200, or no reply (refused, reset, timeout); it is counted by kind.
Latency is per HTTP request. The server's resident memory (VmRSS of /proc/PID/status) is read every
`--sample-s` seconds: "start" when the load begins, after a warm-up (WebShop: one episode that buys something,
as the first purchase loads the reward's spaCy pipeline, ~230 MiB; Search-QA: one retrieval), "middle" at
half time, "end" when the load stops. Memory counts as bounded when end <= start x `--rss-tolerance` (1.5: room
for the allocator's warm-up under 32 concurrent request threads) and the second half grew by at most 10% (end
<= middle x 1.1): a leak keeps growing through the second half, warm-up does not.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import re
import select
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness import cpu_model
from rich.console import Console
from rich.table import Table

SECOND_HALF_TOLERANCE = 1.10
PRODUCT_ID = re.compile(r"^b0[a-z0-9]{8}$")
INSTRUCTION = re.compile(r"Instruction: \[SEP\] (.*?) \[SEP\]")
STOPWORDS = {"i", "a", "an", "the", "and", "with", "that", "is", "for", "of", "need", "want", "looking", "am",
             "price", "lower", "than", "dollars", "to", "in", "my", "me", "size", "color"}


# ---- servers -------------------------------------------------------------------------------------------
def rss_mb(pid: int) -> float | None:
    """Resident memory of `pid` in MiB (VmRSS), None where /proc is not there."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


@contextlib.contextmanager
def server_process(argv: list[str], name: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """Start a server CLI (`--port 0`); yields (process, base URL) once its banner ("... on http://HOST:PORT")
    is printed, i.e. once the socket is bound. The request log goes to a temporary file, shown if it fails."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryFile(mode="w+") as log:
        proc = subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, stderr=log, text=True, env=env)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            found = re.search(r" on (http://[\d.]+:\d+)", line)
            if not found:
                log.seek(0)
                raise RuntimeError(f"the {name} server did not start: {line!r}\n{log.read()[-3000:]}")
            yield proc, found.group(1)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def http(url: str, payload: Any = None, method: str | None = None, timeout: float = 600.0) -> tuple[int, Any]:
    """(status, parsed JSON reply or None)."""
    data = json.dumps(payload).encode() if payload is not None else None
    request = urllib.request.Request(url, data=data, method=method or ("POST" if data is not None else "GET"),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            raw, status = reply.read(), reply.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, None


# ---- load ----------------------------------------------------------------------------------------------
@dataclass
class Tally:
    """What the clients saw: latencies (seconds) and errors, per request kind; thread-safe."""

    latencies: list[float] = field(default_factory=list)
    by_kind: dict[str, list[float]] = field(default_factory=dict)
    kinds: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    episodes: int = 0
    purchases: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def timed(self, kind: str, url: str, payload: Any = None, method: str | None = None) -> tuple[int, Any]:
        started = time.perf_counter()
        try:
            status, body = http(url, payload, method)
        except (OSError, ValueError) as exc:  # refused, reset, timed out
            status, body = 0, None
            error = f"{kind}: {type(exc).__name__}"
        else:
            error = f"{kind}: HTTP {status}" if status != 200 else ""
        took = time.perf_counter() - started
        with self.lock:
            self.latencies.append(took)
            self.by_kind.setdefault(kind, []).append(took)
            self.kinds[kind] += 1
            if error:
                self.errors[error] += 1
        return status, body


def webshop_client(base: str, tally: Tally, stop: threading.Event, rng: random.Random, max_steps: int,
                   think: Callable[[], None]) -> None:
    """Episodes of an agent that searches with words of its instruction and clicks around, until `stop`."""
    while not stop.is_set():
        status, body = tally.timed("reset", base + "/api/sessions", {"split": "train", "goal": None})
        think()
        if status != 200 or not isinstance(body, dict):
            time.sleep(0.1)
            continue
        sid = body["sid"]
        found = INSTRUCTION.search(body.get("observation", ""))
        words = [w for w in re.findall(r"[a-z]+", found.group(1).lower() if found else "") if w not in STOPWORDS]
        for _ in range(max_steps):
            if stop.is_set():
                break
            action = pick_action(body.get("admissible_actions", []), words, rng)
            status, reply = tally.timed("step", f"{base}/api/sessions/{sid}/step", {"action": action})
            think()
            if status != 200 or not isinstance(reply, dict):
                break
            body = reply
            if rng.random() < 0.10:
                tally.timed("state", f"{base}/s/{sid}/state.json")
                think()
            if body.get("done"):
                with tally.lock:
                    tally.purchases += 1
                break
        tally.timed("close", f"{base}/api/sessions/{sid}", method="DELETE")
        think()
        with tally.lock:
            tally.episodes += 1


def pick_action(admissible: list[str], words: list[str], rng: random.Random) -> str:
    """One agent action from the admissible list: search with instruction words, else a weighted click."""
    if rng.random() < 0.03:
        return rng.choice(["click[no such thing]", "search for a shirt", "buy it"])
    if "search[<your query>]" in admissible:
        picked = rng.sample(words, min(len(words), rng.randint(2, 5))) if words else ["shirt"]
        return f"search[{' '.join(picked)}]"
    names = [a[len("click["):-1] for a in admissible if a.startswith("click[") and a.endswith("]")]
    if not names:
        return "click[< prev]"
    weights = []
    for name in names:
        if PRODUCT_ID.match(name):
            weights.append(3.0)
        elif name == "buy now":
            weights.append(2.0)
        elif name in ("back to search", "< prev"):
            weights.append(0.5)
        elif name == "next >":
            weights.append(0.7)
        else:  # options and the description / features / reviews tabs
            weights.append(1.5)
    return f"click[{rng.choices(names, weights)[0]}]"


def search_qa_client(base: str, tally: Tally, stop: threading.Event, rng: random.Random, queries: list[str],
                     think: Callable[[], None]) -> None:
    while not stop.is_set():
        batch = rng.sample(queries, rng.randint(1, 3))
        tally.timed("retrieve", base + "/retrieve", {"queries": batch, "topk": 3, "return_scores": True})
        think()


def slow_connections(host: str, port: int, count: int, stop: threading.Event, interval_s: float = 1.0) -> None:
    """Hold `count` connections that never finish a request, until `stop`: the even ones trickle a request
    head a byte every `interval_s`, the odd ones send nothing; one the server has answered (a 408) or closed
    is opened again."""
    head = b"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nX-Slow: "
    conns: list[socket.socket | None] = [None] * count
    sent = [0] * count
    try:
        while True:
            for i, sock in enumerate(conns):
                try:
                    if sock is not None and select.select([sock], [], [], 0)[0]:  # answered or closed
                        sock.close()
                        sock = conns[i] = None
                    if sock is None:
                        sock = conns[i] = socket.create_connection((host, port), timeout=5)
                        sent[i] = 0
                    if i % 2 == 0:
                        sock.send(head[sent[i]:sent[i] + 1] if sent[i] < len(head) else b"a")
                        sent[i] += 1
                except OSError:  # refused, reset: try again on the next round
                    if conns[i] is not None:
                        conns[i].close()  # type: ignore[union-attr]
                    conns[i] = None
            if stop.wait(interval_s):
                return
    finally:
        for sock in conns:
            if sock is not None:
                sock.close()


_WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex jolly grumpy kings".split()


def long_prompt(seed: int) -> str:
    """About 3,900 tokens of the SmolLM2 tokenizer (the report's long prompts)."""
    return " ".join(_WORDS[(seed + k * 7) % len(_WORDS)] + str(k % 10) for k in range(1775))


def policy_client(url: str, tally: Tally, stop: threading.Event, kind: str, rng: random.Random,
                  think: Callable[[], None]) -> None:
    """Chat requests of one kind back to back: `long` (~3,900 tokens, max_tokens 64) or `short` (max_tokens 16)."""
    while not stop.is_set():
        content = long_prompt(rng.randrange(1000)) if kind == "long" else f"Say hi to {rng.randrange(1000)}."
        tally.timed(kind, url, {"messages": [{"role": "user", "content": content}], "temperature": 0,
                                "max_tokens": 64 if kind == "long" else 16})
        think()


@dataclass
class Soak:
    server: str
    clients: int
    seconds: float
    requests: int
    requests_per_s: float
    errors: int
    error_kinds: dict[str, int]
    requests_by_kind: dict[str, int]
    episodes: int  # WebShop: episodes played, and how many ended in a purchase
    purchases: int
    p50_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float
    rss_mb_ready: float | None  # the server bound its socket, before the warm-up request(s)
    rss_mb_start: float | None
    rss_mb_middle: float | None
    rss_mb_end: float | None
    rss_mb_peak: float | None
    rss_end_over_start: float | None
    rss_end_over_middle: float | None
    memory_bounded: bool | None
    rss_samples: list[tuple[float, float]]  # (seconds into the load, MiB)
    latency_ms_by_kind: dict[str, dict[str, float]] = field(default_factory=dict)  # kind -> requests, p50, p99, max


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, max(0, round(q * len(sorted_values)) - 1))]


def soak(name: str, pid: int, ready_rss: float | None, clients: int, seconds: float, sample_s: float, tolerance: float,
         client: Callable[[Tally, threading.Event, random.Random], None], console: Console) -> Soak:
    """`clients` threads run `client` for `seconds` while the server's RSS is sampled."""
    tally, stop = Tally(), threading.Event()
    samples: list[tuple[float, float]] = []
    started = time.monotonic()

    def sample() -> None:
        value = rss_mb(pid)
        if value is not None:
            samples.append((round(time.monotonic() - started, 1), round(value, 1)))

    sample()
    threads = [threading.Thread(target=client, args=(tally, stop, random.Random(1000 + i)), daemon=True)
               for i in range(clients)]
    for t in threads:
        t.start()
    next_sample, next_note = started + sample_s, started + 30.0
    while (now := time.monotonic()) < started + seconds:
        time.sleep(max(0.0, min(next_sample, started + seconds) - now))
        if time.monotonic() >= next_sample:
            sample()
            next_sample += sample_s
        if time.monotonic() >= next_note:
            with tally.lock:
                done, errors = len(tally.latencies), sum(tally.errors.values())
            rss = samples[-1][1] if samples else float("nan")
            console.log(f"{name}: {time.monotonic() - started:.0f} s, {done} requests, {errors} errors, "
                        f"RSS {rss:.1f} MiB")
            next_note += 30.0
    stop.set()
    sample()  # the end: the load stops here (threads finish their request in flight)
    elapsed = time.monotonic() - started
    for t in threads:
        t.join(timeout=120)
    with tally.lock:
        latencies = sorted(tally.latencies)
        errors = dict(tally.errors)
        kinds = dict(tally.kinds)
        by_kind = {kind: sorted(values) for kind, values in tally.by_kind.items()}
    start_rss = samples[0][1] if samples else None
    end_rss = samples[-1][1] if samples else None
    middle_rss = min(samples, key=lambda s: abs(s[0] - elapsed / 2))[1] if samples else None
    over_start = end_rss / start_rss if start_rss and end_rss else None
    over_middle = end_rss / middle_rss if middle_rss and end_rss else None
    bounded = (over_start <= tolerance and over_middle <= SECOND_HALF_TOLERANCE
               if over_start is not None and over_middle is not None else None)
    return Soak(name, clients, round(elapsed, 1), len(latencies), len(latencies) / elapsed, sum(errors.values()),
                errors, kinds, tally.episodes, tally.purchases, 1000 * percentile(latencies, 0.50), 1000 * percentile(latencies, 0.99),
                1000 * statistics.fmean(latencies) if latencies else float("nan"),
                1000 * latencies[-1] if latencies else float("nan"), ready_rss, start_rss, middle_rss, end_rss,
                max((s[1] for s in samples), default=None), over_start, over_middle, bounded, samples,
                {kind: {"requests": len(values), "p50": round(1000 * percentile(values, 0.50), 1),
                        "p99": round(1000 * percentile(values, 0.99), 1), "max": round(1000 * values[-1], 1)}
                 for kind, values in sorted(by_kind.items())})


def run_webshop(args: argparse.Namespace, console: Console) -> Soak:
    argv = ["-m", "agentgym_opsd.environments.webshop.serve", "--port", "0", "--num-products",
            str(args.num_products)]
    with server_process(argv, "WebShop") as (proc, base):
        ready = rss_mb(proc.pid)
        status, body = http(base + "/api/sessions", {"split": "train", "goal": 0})  # warm-up: one short episode
        if status != 200:
            raise RuntimeError(f"WebShop: the first session got HTTP {status}: {body}")
        sid = body["sid"]
        _, body = http(f"{base}/api/sessions/{sid}/step", {"action": "search[shirt]"})
        product = next(a for a in body["admissible_actions"] if PRODUCT_ID.match(a[len("click["):-1]))
        for action in (product, "click[buy now]"):  # the first purchase loads the reward's spaCy pipeline
            status, body = http(f"{base}/api/sessions/{sid}/step", {"action": action})
        if status != 200 or not body.get("done"):
            raise RuntimeError(f"WebShop: the warm-up purchase got HTTP {status}: {body}")
        http(f"{base}/api/sessions/{sid}", method="DELETE")
        think = thinker(args.think_ms)
        return soak("webshop", proc.pid, ready, args.clients, 60 * args.minutes, args.sample_s, args.rss_tolerance,
                    lambda tally, stop, rng: webshop_client(base, tally, stop, rng, args.max_steps, think), console)


@contextlib.contextmanager
def search_qa_server() -> Iterator[tuple[subprocess.Popen[str], str, float | None, list[str]]]:
    """The retrieval server CLI on the tiny world, warmed up: yields (process, base URL, RSS when ready, the
    queries agents send)."""
    from agentgym_opsd.environments.search_qa.embedding import HashingEncoder
    from agentgym_opsd.environments.search_qa.generator import generate_dataset
    from agentgym_opsd.environments.search_qa.index import IndexConfig, write_index_folder

    data = generate_dataset("tiny")
    queries = sorted({q.question for split in data.questions.values() for q in split}
                     | {h.query for split in data.questions.values() for q in split for h in q.hops}
                     | {p.title for p in data.passages})
    with tempfile.TemporaryDirectory() as tmp:
        index = write_index_folder(Path(tmp) / "idx", data.passages, HashingEncoder().encode,
                                   IndexConfig(kind="flat"), progress=False)
        argv = ["-c", server_targets().SEARCH_QA_CHILD, "--index", str(index), "--port", "0"]
        with server_process(argv, "Search-QA") as (proc, base):
            ready = rss_mb(proc.pid)
            status, body = http(base + "/retrieve", {"queries": ["warm up"], "topk": 3})
            if status != 200:
                raise RuntimeError(f"Search-QA: the first request got HTTP {status}: {body}")
            yield proc, base, ready, queries


def run_search_qa(args: argparse.Namespace, console: Console) -> Soak:
    with search_qa_server() as (proc, base, ready, queries):
        think = thinker(args.think_ms)
        return soak("search_qa", proc.pid, ready, args.clients, 60 * args.minutes, args.sample_s, args.rss_tolerance,
                    lambda tally, stop, rng: search_qa_client(base, tally, stop, rng, queries, think), console)


def run_search_qa_slow(args: argparse.Namespace, console: Console) -> Soak:
    with search_qa_server() as (proc, base, ready, queries):
        host, port = base.removeprefix("http://").rsplit(":", 1)
        stop = threading.Event()
        holder = threading.Thread(target=slow_connections, args=(host, int(port), args.slow_clients, stop), daemon=True)
        holder.start()
        try:
            think = thinker(args.think_ms)
            return soak("search_qa_slow", proc.pid, ready, args.clients, 60 * args.minutes, args.sample_s,
                        args.rss_tolerance,
                        lambda tally, stop, rng: search_qa_client(base, tally, stop, rng, queries, think), console)
        finally:
            stop.set()
            holder.join(timeout=30)


def run_policy_mixed(args: argparse.Namespace, console: Console) -> Soak:
    argv = ["-m", "agentgym_opsd.models.policy_server", args.policy_model, "--port", "0"]
    with server_process(argv, "policy") as (proc, base):
        url = base + "/v1/chat/completions"
        ready = rss_mb(proc.pid)
        for content, max_tokens in (("Say hi.", 16), (long_prompt(0), 64)):  # warm-up: one of each kind
            status, body = http(url, {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens})
            if status != 200:
                raise RuntimeError(f"policy server: the warm-up request got HTTP {status}: {body}")
        think = thinker(args.think_ms)
        kinds = ["long"] * args.long_clients + ["short"] * args.short_clients
        next_client = itertools.count()  # each client thread takes the next kind as it starts
        return soak("policy_mixed", proc.pid, ready, len(kinds), 60 * args.minutes, args.sample_s, args.rss_tolerance,
                    lambda tally, stop, rng: policy_client(url, tally, stop, kinds[next(next_client)], rng, think),
                    console)


def thinker(think_ms: float) -> Callable[[], None]:
    return (lambda: time.sleep(think_ms / 1000)) if think_ms > 0 else (lambda: None)


def table(results: list[Soak], args: argparse.Namespace) -> Table:
    t = Table(title=f"soak: {args.clients} concurrent clients, {args.minutes:g} min per server")
    for col in ("server", "requests", "req/s", "errors", "p50 ms", "p99 ms", "max ms", "p99 ms by kind",
                "RSS start MiB", "RSS middle MiB", "RSS end MiB", "RSS peak MiB", "end/start", "end/middle",
                "bounded"):
        t.add_column(col, justify="left" if col == "server" else "right")

    def mb(x: float | None) -> str:
        return "-" if x is None else f"{x:.1f}"

    for r in results:
        t.add_row(r.server, str(r.requests), f"{r.requests_per_s:.1f}", str(r.errors), f"{r.p50_ms:.1f}",
                  f"{r.p99_ms:.1f}", f"{r.max_ms:.0f}",
                  " ".join(f"{kind} {v['p99']:.0f}" for kind, v in r.latency_ms_by_kind.items()), mb(r.rss_mb_start), mb(r.rss_mb_middle), mb(r.rss_mb_end),
                  mb(r.rss_mb_peak), "-" if r.rss_end_over_start is None else f"{r.rss_end_over_start:.2f}",
                  "-" if r.rss_end_over_middle is None else f"{r.rss_end_over_middle:.2f}",
                  {True: "yes", False: "NO", None: "-"}[r.memory_bounded])
    return t


@dataclass
class Attack:
    """One server's figures under idle and trickling connections."""

    server: str
    connections_held: int
    requests: int
    requests_lost: int
    p50_ms: float
    max_ms: float


def hold(target_host: str, port: int, count: int, trickle_s: float | None, stop: threading.Event,
         held: list[int]) -> None:
    """Keep `count` connections open to the server (idle, or trickling a head a byte every `trickle_s`), opening
    each again once the server answers or closes it; `held[0]` is how many are open now."""
    socks: list[socket.socket | None] = [None] * count
    while not stop.is_set():
        for i, sock in enumerate(socks):
            if sock is None:
                with contextlib.suppress(OSError):
                    sock = socks[i] = socket.create_connection((target_host, port), timeout=5)
                    sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            elif select.select([sock], [], [], 0)[0]:  # answered (408) or closed: open another
                sock.close()
                socks[i] = None
            elif trickle_s is not None:
                with contextlib.suppress(OSError):
                    sock.send(b"a")
        held[0] = sum(s is not None for s in socks)
        stop.wait(trickle_s or 0.5)
    for sock in socks:
        if sock is not None:
            sock.close()


def server_targets() -> Any:
    """`tests/server_targets.py`: the servers we ship, how each is started (the Search-QA child with the hashing
    encoder among them) and a normal request to each; the hostile-client battery and this benchmark share it."""
    tests = str(Path(__file__).resolve().parents[1] / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    import server_targets as targets

    return targets


def run_attack(args: argparse.Namespace, console: Console) -> list[Attack]:
    targets = server_targets()
    TARGETS, normal_request, start = targets.TARGETS, targets.normal_request, targets.start

    results = []
    for target in TARGETS:
        with start(target) as server:
            normal_request(server, timeout_s=120)  # warm up
            stop, idle, trickling = threading.Event(), [0], [0]
            holders = [threading.Thread(target=hold, args=(server.host, server.port, args.idle, None, stop, idle)),
                       threading.Thread(target=hold, args=(server.host, server.port, args.trickling, 1.5, stop,
                                                           trickling))]
            for thread in holders:
                thread.start()
            time.sleep(2.0)  # all connections open
            held = idle[0] + trickling[0]
            latencies, lost = [], 0
            for _ in range(args.attack_requests):
                try:
                    status, seconds = normal_request(server, timeout_s=60)
                except OSError:
                    status, seconds = 0, 60.0
                lost += status != 200
                latencies.append(seconds * 1000)
            stop.set()
            for thread in holders:
                thread.join()
        latencies.sort()
        results.append(Attack(target.name, held, len(latencies), lost, statistics.median(latencies), latencies[-1]))
        console.print(results[-1])
    return results


def attack_table(results: list[Attack]) -> Table:
    t = Table(title="a normal request while idle and trickling connections are held")
    for column in ("server", "connections held", "requests", "lost", "p50 ms", "max ms"):
        t.add_column(column, justify="left" if column == "server" else "right")
    for r in results:
        t.add_row(r.server, str(r.connections_held), str(r.requests), str(r.requests_lost), f"{r.p50_ms:.1f}",
                  f"{r.max_ms:.1f}")
    return t


def main_attack(args: argparse.Namespace) -> int:
    console = Console(width=200)
    results = run_attack(args, console)
    console.print(attack_table(results))
    existing = json.loads(args.json.read_text(encoding="utf-8")) if args.json.exists() else {}
    existing["attack"] = {
        "settings": {"idle": args.idle, "trickling": args.trickling, "trickle_s": 1.5,
                     "requests": args.attack_requests},
        "machine": {"cpu_model": cpu_model(), "cpus": os.cpu_count(), "load_average": list(os.getloadavg())},
        "notes": args.note,
        "results": [asdict(r) for r in results]}
    args.json.write_text(json.dumps(existing, indent=1) + "\n", encoding="utf-8")
    console.print(f"wrote {args.json}")
    return 0 if all(r.requests_lost == 0 for r in results) else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=32, help="concurrent clients per server (default 32)")
    p.add_argument("--minutes", type=float, default=10.0, help="load per server (default 10)")
    p.add_argument("--servers", nargs="+", choices=("webshop", "search_qa", "search_qa_slow", "policy_mixed"),
                   default=["webshop", "search_qa"], help="loads to run, one after the other (default webshop "
                                                          "search_qa; the docstring says what each is)")
    p.add_argument("--num-products", type=int, default=2000, help="WebShop generated catalogue (default 2000)")
    p.add_argument("--max-steps", type=int, default=10, help="WebShop steps per episode at most (default 10)")
    p.add_argument("--think-ms", type=float, default=0.0, help="client pause after each request (default 0)")
    p.add_argument("--slow-clients", type=int, default=64,
                   help="search_qa_slow: connections that never finish a request (default 64)")
    p.add_argument("--policy-model", default="tiny-random", help="policy_mixed: the model served (default tiny-random)")
    p.add_argument("--long-clients", type=int, default=3, help="policy_mixed: long-prompt clients (default 3)")
    p.add_argument("--short-clients", type=int, default=2, help="policy_mixed: short-request clients (default 2)")
    p.add_argument("--sample-s", type=float, default=5.0, help="seconds between RSS readings (default 5)")
    p.add_argument("--rss-tolerance", type=float, default=1.5, help="bounded: end <= start x this (default 1.5)")
    p.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "soak.json")
    p.add_argument("--note", action="append", default=[], help="a line for the JSON's notes (repeatable)")
    p.add_argument("--attack", action="store_true", help="measure every server under idle and trickling "
                                                         "connections instead (see the docstring)")
    p.add_argument("--idle", type=int, default=50, help="--attack: idle connections held (default 50)")
    p.add_argument("--trickling", type=int, default=10, help="--attack: trickling connections held (default 10)")
    p.add_argument("--attack-requests", type=int, default=20, help="--attack: normal requests timed (default 20)")
    args = p.parse_args(argv)
    if args.attack:
        return main_attack(args)
    if min(args.clients, args.short_clients) < 1 or args.minutes <= 0 or min(args.slow_clients, args.long_clients) < 0:
        p.error("--clients, --short-clients and --minutes must be positive, --slow-clients and --long-clients >= 0")

    console = Console(width=200)
    load_before = os.getloadavg()
    runners = {"webshop": run_webshop, "search_qa": run_search_qa, "search_qa_slow": run_search_qa_slow,
               "policy_mixed": run_policy_mixed}
    results = [runners[name](args, console) for name in args.servers]
    console.print(table(results, args))
    notes = [*args.note,
             f"one machine for clients and server: {os.cpu_count()} CPUs; load average (1, 5, 15 min) "
             f"{' '.join(f'{x:.2f}' for x in load_before)} before, {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
             "after",
             "clients are threads of one Python process; WebShop and the policy server run Werkzeug's threaded "
             "server (a thread per connection), Search-QA its pooled one (a connection thread, 32 workers); "
             "a connection per request",
             "Search-QA: the tiny generated world (133 passages), flat index, hashing encoder (no MiniLM)",
             f"memory bounded: end <= start x {args.rss_tolerance} and end <= middle x {SECOND_HALF_TOLERANCE}"]
    args.json.parent.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k not in ("note", "json")}
    args.json.write_text(json.dumps({"settings": settings, "notes": notes, "results": [asdict(r) for r in results]},
                                    indent=1) + "\n", encoding="utf-8")
    console.print(f"wrote {args.json}")
    return 0 if all(r.errors == 0 and r.memory_bounded is not False for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
