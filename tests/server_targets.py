"""The servers we ship, each started through its own command line in a process of its own, for the hostile-client
battery (tests/test_hostile_clients.py) and the soak benchmark (benchmarks/bench_soak.py). A server joins both by
one line in TARGETS."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
URL = re.compile(r"http://([\d.]+):(\d+)")

# The retrieval server's real CLI, with the hashing encoder in place of the MiniLM default (no model download).
SEARCH_QA_CHILD = """
import sys
from agentgym_opsd.environments.search_qa import retriever
from agentgym_opsd.environments.search_qa.embedding import HashingEncoder
from agentgym_opsd.environments.search_qa.serve import main

class HashingRetriever(retriever.DenseRetriever):
    def __init__(self, folder, encoder=None, **kwargs):
        super().__init__(folder, encoder or HashingEncoder().encode, **kwargs)

retriever.DenseRetriever = HashingRetriever  # serve.main looks the class up when it runs
raise SystemExit(main(sys.argv[1:]))
"""


def search_qa_index(folder: Path) -> list[str]:
    """The tiny generated world indexed with the hashing encoder in `folder`; the CLI's --index argument."""
    from agentgym_opsd.environments.search_qa.embedding import HashingEncoder
    from agentgym_opsd.environments.search_qa.generator import generate_dataset
    from agentgym_opsd.environments.search_qa.index import IndexConfig, write_index_folder

    index = write_index_folder(folder / "idx", generate_dataset("tiny").passages, HashingEncoder().encode,
                               IndexConfig(kind="flat"), progress=False)
    return ["--index", str(index)]


@dataclass(frozen=True)
class Target:
    """A server: how to start it (`argv` after the interpreter, `prepare` adds arguments made in a temporary
    folder), a normal request (`method path`, `body`: answered 200), the limit on its bodies, and how a client
    holds one of its sessions (`sessions`: "connections" for plain HTTP, "websocket" for OpenEnv's /ws)."""

    name: str
    argv: tuple[str, ...]
    normal: str
    body: bytes | None
    max_body_bytes: int
    sessions: str = "connections"
    prepare: Callable[[Path], list[str]] | None = None

    @property
    def json_path(self) -> str:
        return self.normal.split()[1]


_CHAT = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}).encode()
TARGETS = [
    Target("retrieval", ("-c", SEARCH_QA_CHILD), "POST /retrieve", b'{"queries": ["who"], "topk": 3}', 2 << 20,
           prepare=search_qa_index),
    Target("webshop", ("-m", "agentgym_opsd.environments.webshop.serve", "--num-products", "200"),
           "POST /api/sessions", b"{}", 64 << 10),
    Target("policy", ("-m", "agentgym_opsd.models.policy_server", "tiny-random"), "POST /v1/chat/completions",
           _CHAT, 1 << 20),
    Target("openenv", ("-m", "agentgym_opsd", "serve-openenv", "ALFWorld-v0:easy"), "POST /reset", b'{"seed": 0}',
           1 << 20, sessions="websocket"),
]


@dataclass
class Running:
    """A started server: its process, host and port."""

    proc: subprocess.Popen[str]
    host: str
    port: int
    target: Target

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@contextlib.contextmanager
def start(target: Target, *extra: str) -> Iterator[Running]:
    """Start `target` on a free loopback port with `extra` arguments; yields once its banner names the address.
    The process is stopped (SIGTERM, then SIGKILL) on the way out if it still runs."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        prepared = target.prepare(Path(tmp)) if target.prepare else []
        argv = [sys.executable, *target.argv, *prepared, "--port", "0", *extra]
        # stderr to a file: a server logging each request would fill a pipe nobody reads, and block
        log = (Path(tmp) / "stderr.log").open("w+")
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()  # the banner is the first line
            found = URL.search(line)
            if not found:
                log.seek(0)
                raise RuntimeError(f"{target.name} did not start: {line!r} {log.read()[-3000:]}")
            yield Running(proc, found.group(1), int(found.group(2)), target)
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            log.close()


def request(server: Running, method: str, path: str, body: bytes | None = None, *,
            headers: dict[str, str] | None = None, timeout_s: float = 30.0) -> tuple[int, dict[str, str], Any]:
    """One HTTP request; (status, headers with lower-case names, the JSON body or None when it is not JSON)."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=timeout_s)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        data = response.read()
        try:
            value = json.loads(data)
        except ValueError:
            value = None
        return response.status, {k.lower(): v for k, v in response.getheaders()}, value
    finally:
        conn.close()


def normal_request(server: Running, timeout_s: float = 30.0) -> tuple[int, float]:
    """The target's normal request: (status, seconds)."""
    method, path = server.target.normal.split()
    start_s = time.perf_counter()
    status, _, _ = request(server, method, path, server.target.body, timeout_s=timeout_s)
    return status, time.perf_counter() - start_s


def connect(server: Running, timeout_s: float = 10.0) -> socket.socket:
    sock = socket.create_connection((server.host, server.port), timeout=timeout_s)
    return sock


def read_answer(sock: socket.socket, timeout_s: float) -> tuple[int | None, dict[str, str], bytes]:
    """What the server sent on `sock` until it closed it or `timeout_s` passed: (status or None, headers, body)."""
    sock.settimeout(0.2)
    data, deadline = b"", time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            break
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1]) if lines and lines[0].startswith("HTTP/") else None
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, body
