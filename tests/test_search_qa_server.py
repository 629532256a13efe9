"""Search-QA retrieval server: Search-R1's POST /retrieve format, 400s for bad requests, the HTTP client."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from agentgym_opsd.environments.search_qa.embedding import HashingEncoder
from agentgym_opsd.environments.search_qa.generator import generate_dataset
from agentgym_opsd.environments.search_qa.index import IndexConfig, write_index_folder
from agentgym_opsd.environments.search_qa.retriever import DenseRetriever, HttpRetriever, RetrievalError
from agentgym_opsd.environments.search_qa.serve import DEFAULT_TOPK, create_app
from agentgym_opsd.serving import BackgroundServer, HTTPLimits, wsgi_host


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    data = generate_dataset("tiny")
    folder = write_index_folder(tmp_path_factory.mktemp("srv") / "idx", data.passages, HashingEncoder().encode,
                                IndexConfig(kind="flat"), progress=False)
    retriever = DenseRetriever(folder, encoder=HashingEncoder().encode)
    httpd = BackgroundServer(wsgi_host(create_app(retriever, num_passages=len(data.passages)), HTTPLimits())).start()
    url = httpd.url
    deadline = time.monotonic() + 10
    while True:  # readiness by polling /health, not by sleeping a fixed time
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as r:
                if json.loads(r.read())["status"] == "ok":
                    break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    yield url, data, folder
    httpd.stop()


def _post(url: str, body: bytes) -> tuple[int, dict]:
    req = urllib.request.Request(url + "/retrieve", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_retrieve_format(server) -> None:
    url, data, _ = server
    target = data.passages[10]
    status, reply = _post(url, json.dumps({"queries": [target.contents, "x"], "topk": 4, "return_scores": True}).encode())
    assert status == 200 and len(reply["result"]) == 2
    first = reply["result"][0][0]
    assert first["document"] == {"id": target.id, "contents": target.contents}
    assert isinstance(first["score"], float) and len(reply["result"][0]) == 4
    status, reply = _post(url, json.dumps({"queries": [target.contents], "topk": 2, "return_scores": False}).encode())
    # Search-R1's shape without scores: bare documents, not {"document": ...} wrappers
    assert status == 200 and reply["result"][0][0] == {"id": target.id, "contents": target.contents}
    assert len(reply["result"][0]) == 2


@pytest.mark.parametrize("topk", ["missing", None, 0])
def test_topk_missing_null_or_zero_falls_back_to_the_default(server, topk) -> None:
    body = {"queries": ["x"], **({} if topk == "missing" else {"topk": topk})}
    status, reply = _post(server[0], json.dumps(body).encode())
    assert status == 200 and len(reply["result"][0]) == DEFAULT_TOPK == 3


@pytest.mark.parametrize("body", [
    b"{not json", b"\xff\xfe\x00garbage", b"[1, 2]", b'{"queries": "one", "topk": 3}', b'{"queries": [1], "topk": 3}',
    b'{"queries": ["a"], "topk": -1}', b'{"queries": ["a"], "topk": 101}', b'{"queries": ["a"], "topk": "5"}',
    b'{"queries": ["a"], "topk": 3, "return_scores": "yes"}',
])
def test_bad_requests_get_400_with_message(server, body: bytes) -> None:
    status, reply = _post(server[0], body)
    assert status == 400 and reply["error"]


def test_long_and_odd_queries_are_answered(server) -> None:
    status, reply = _post(server[0], json.dumps({"queries": ["y" * 50_000, "\u00e9t\u00e9 \U0001f600", ""],
                                                 "topk": 1}).encode())
    assert status == 200 and [len(r) for r in reply["result"]] == [1, 1, 1]


def test_lone_surrogates_are_400_not_answered_with_garbage(server) -> None:
    status, reply = _post(server[0], json.dumps({"queries": ["\udcff odd"], "topk": 1}).encode())
    assert status == 400 and "surrogate" in reply["error"]


def test_http_client_matches_in_process(server) -> None:
    url, data, folder = server
    client = HttpRetriever(url)
    local = DenseRetriever(folder, encoder=HashingEncoder().encode)
    queries = [p.contents for p in data.passages[:5]]
    remote_hits, local_hits = client.retrieve(queries, 3), local.retrieve(queries, 3)
    assert [[h.passage for h in hs] for hs in remote_hits] == [[h.passage for h in hs] for hs in local_hits]
    with pytest.raises(RetrievalError):
        HttpRetriever("http://127.0.0.1:9", timeout_s=2).retrieve(["x"], 1)
    with pytest.raises(ValueError):
        HttpRetriever("ftp://nowhere")
