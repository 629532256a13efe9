"""Requests/s of the policy server answering one request at a time (`--max-batch 1`) vs batching concurrent
requests, with the same concurrent clients, side by side in one run (prints a rich table).

    python benchmarks/bench_policy_server.py                                   # tiny-random, 16 clients
    python benchmarks/bench_policy_server.py --smollm --requests-per-client 4  # embedded SmolLM2-135M too
    python benchmarks/bench_policy_server.py --json benchmarks/results/policy_server.json

Each setting starts `python -m agentgym_opsd.models.policy_server MODEL --port 0 --max-batch B` as a subprocess (so
the clients do not share the server's interpreter lock; `--threads` torch threads, 1 by default because
a small shared CPU box slows down badly when torch's threads and the request threads compete), warms it up
with one request per client, then `--clients` threads each send `--requests-per-client` chat requests back
to back (distinct prompts, `--max-tokens` each, every temperature of `--temperatures`: sampled and greedy
decoding cost differently per row). Requests/s = answered requests / wall time of that phase; the phases
of the two settings alternate `--repeats` times and the median is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import requests
from rich.console import Console
from rich.table import Table

from agentgym_opsd.serving import positive_int

SYSTEM = "You play a text game. Answer with one action inside <action>...</action>."


@dataclass
class Phase:
    """One client phase against one server."""

    seconds: float
    latencies: list[float]
    batches: int
    completion_tokens: int


@dataclass
class Result:
    model: str
    temperature: float
    max_batch: int
    clients: int
    requests: int  # per repeat
    repeats: int
    requests_per_s: float  # median over the repeats
    requests_per_s_all: list[float]
    mean_latency_s: float
    p95_latency_s: float
    mean_batch: float
    completion_tokens: int  # over all repeats


def start_server(model: str, max_batch: int, max_tokens: int, threads: int) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": str(threads)}
    log = tempfile.TemporaryFile(mode="w+")  # the server's request log; shown only if it fails to start
    proc = subprocess.Popen([sys.executable, "-m", "agentgym_opsd.models.policy_server", model, "--port", "0",
                             "--max-batch", str(max_batch), "--max-new-tokens", str(max_tokens),
                             "--max-queue", "256"],
                            stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # "serving MODEL on http://HOST:PORT", printed once the socket is bound
    if " on http://" not in line:
        proc.kill()
        proc.wait()
        log.seek(0)
        raise RuntimeError(f"the policy server did not start: {line!r}\n{log.read()[-3000:]}")
    return proc, line.rsplit(" on ", 1)[1].strip()


def run_clients(url: str, clients: int, per_client: int, max_tokens: int,
                temperature: float) -> tuple[float, list[float], int]:
    """Every client sends its requests back to back; returns wall seconds, latencies, completion tokens."""
    latencies: list[float] = []
    tokens = [0]
    lock = threading.Lock()

    def client(c: int) -> None:
        with requests.Session() as session:
            for r in range(per_client):
                body = {"messages": [{"role": "system", "content": SYSTEM},
                                     {"role": "user", "content": f"Client {c}, task {r}: you see a drawer. Go."}],
                        "max_tokens": max_tokens, "temperature": temperature}
                start = time.perf_counter()
                reply = session.post(url + "/v1/chat/completions", json=body, timeout=600)
                reply.raise_for_status()
                with lock:
                    latencies.append(time.perf_counter() - start)
                    tokens[0] += reply.json()["usage"]["completion_tokens"]

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    return time.perf_counter() - start, latencies, tokens[0]


def phase(url: str, temperature: float, args: argparse.Namespace) -> Phase:
    batches_before = requests.get(url + "/health", timeout=30).json()["batches"]
    seconds, latencies, tokens = run_clients(url, args.clients, args.requests_per_client, args.max_tokens,
                                             temperature)
    batches = requests.get(url + "/health", timeout=30).json()["batches"] - batches_before
    return Phase(seconds, latencies, batches, tokens)


def summarise(model: str, temperature: float, max_batch: int, phases: list[Phase], clients: int) -> Result:
    rates = [len(p.latencies) / p.seconds for p in phases]
    latencies = sorted(x for p in phases for x in p.latencies)
    n = len(latencies)
    return Result(model, temperature, max_batch, clients, n // len(phases), len(phases), statistics.median(rates),
                  rates, statistics.fmean(latencies), latencies[max(int(0.95 * n) - 1, 0)],
                  n / max(sum(p.batches for p in phases), 1), sum(p.completion_tokens for p in phases))


def measure(model: str, args: argparse.Namespace) -> list[Result]:
    """Both servers run at once (an idle one costs nothing) and the phases alternate between them, so a
    burst of load from elsewhere on the machine hits both settings alike; the median repeat is reported."""
    batches = (1, args.max_batch)
    servers = [start_server(model, b, args.max_tokens, args.threads) for b in batches]
    results = []
    try:
        for temperature in args.temperatures:
            for _, url in servers:  # warm-up: first-call costs out of the measurement
                run_clients(url, args.clients, 1, args.max_tokens, temperature)
            phases: list[list[Phase]] = [[], []]
            for _ in range(args.repeats):
                for side, (_, url) in enumerate(servers):
                    phases[side].append(phase(url, temperature, args))
            results += [summarise(model, temperature, b, ph, args.clients) for b, ph in zip(batches, phases, strict=True)]
    finally:
        for proc, _ in servers:
            proc.terminate()
            proc.wait(timeout=30)
    return results


def table(results: list[Result]) -> Table:
    t = Table(title=f"policy server at {results[0].clients} concurrent clients: one request at a time vs batched")
    for col in ("model", "temperature", "max batch", "requests x repeats", "requests/s (median)", "vs one-at-a-time",
                "requests/s (each repeat)", "mean latency s", "p95 latency s", "mean batch"):
        t.add_column(col, justify="right")
    base = {(r.model, r.temperature): r.requests_per_s for r in results if r.max_batch == 1}
    for r in results:
        ratio = r.requests_per_s / base.get((r.model, r.temperature), float("nan"))
        t.add_row(r.model, f"{r.temperature:g}", str(r.max_batch), f"{r.requests} x {r.repeats}",
                  f"{r.requests_per_s:.2f}", f"{ratio:.2f}x", " ".join(f"{x:.1f}" for x in r.requests_per_s_all),
                  f"{r.mean_latency_s:.2f}", f"{r.p95_latency_s:.2f}", f"{r.mean_batch:.1f}")
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=positive_int, default=16)
    ap.add_argument("--requests-per-client", type=positive_int, default=8)
    ap.add_argument("--max-tokens", type=positive_int, default=32, help="max_tokens of every request")
    ap.add_argument("--max-batch", type=positive_int, default=16, help="the batched setting's --max-batch")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.0], help="0 = greedy")
    ap.add_argument("--repeats", type=positive_int, default=3, help="alternating phases per setting")
    ap.add_argument("--threads", type=positive_int, default=1, help="torch threads of the server")
    ap.add_argument("--smollm", action="store_true", help="also measure embedded:smollm2-135m-instruct")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args()
    models = ["tiny-random"] + (["embedded:smollm2-135m-instruct"] if args.smollm else [])
    results = [r for model in models for r in measure(model, args)]
    Console(width=200).print(table(results))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"settings": vars(args) | {"json": str(args.json)},
                                         "results": [asdict(r) for r in results]}, indent=2) + "\n")


if __name__ == "__main__":
    main()
