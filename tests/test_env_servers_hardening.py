"""Hostile input against the shop site and the retrieval server, sent over real sockets: oversize and
chunked bodies, deep JSON, lone surrogates, the Werkzeug debugger, bad command lines, and build_index
over a folder that is not an index."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pytest
from search_qa_helpers import (
    STACKS_ON_SIGUSR1,
    held_first_call_encoder,
    ignore_sigint,
    server_with_encoder,
    wait_or_show_stacks,
)
from search_qa_helpers import tiny_index as build_tiny_index
from test_webshop_helpers import small_shop

from agentgym_opsd.environments.search_qa.embedding import HashingEncoder
from agentgym_opsd.environments.search_qa.index import IndexConfig, write_index_folder
from agentgym_opsd.environments.search_qa.retriever import DenseRetriever, EncodeBatcher, HttpRetriever
from agentgym_opsd.environments.search_qa.serve import create_app as create_search_app
from agentgym_opsd.serving import BackgroundServer, HTTPLimits, wsgi_host

# ---------------------------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def tiny_index(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    return build_tiny_index(tmp_path_factory.mktemp("hard"))


@contextlib.contextmanager
def serving(app: Any) -> Iterator[str]:
    """`app` on a free loopback port in a background thread; yields its base URL."""
    with BackgroundServer(wsgi_host(app, HTTPLimits())) as httpd:
        yield httpd.url


def send(url: str, path: str, parts: Iterable[bytes], *, content_length: int | None = None,
         content_type: str = "application/json", method: str = "POST",
         timeout_s: float = 30.0) -> tuple[int, str, bytes]:
    """Send `parts` as one body over a raw connection: with `Content-Length: content_length` when given
    (it may claim more than is sent), else `Transfer-Encoding: chunked`, one chunk per part. Sending stops
    quietly if the server hangs up early. Returns (status, content type, body)."""
    host = urlsplit(url)
    conn = http.client.HTTPConnection(host.hostname or "127.0.0.1", host.port, timeout=timeout_s)
    try:
        conn.putrequest(method, path)
        conn.putheader("Content-Type", content_type)
        if content_length is None:
            conn.putheader("Transfer-Encoding", "chunked")
        else:
            conn.putheader("Content-Length", str(content_length))
        conn.endheaders()
        with contextlib.suppress(OSError):
            for part in parts:
                conn.send(b"%x\r\n%s\r\n" % (len(part), part) if content_length is None else part)
            if content_length is None:
                conn.send(b"0\r\n\r\n")
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type", ""), response.read()
    finally:
        conn.close()


def post_json(url: str, path: str, payload: Any) -> tuple[int, Any]:
    body = json.dumps(payload).encode()
    status, _, raw = send(url, path, [body], content_length=len(body))
    return status, json.loads(raw)


HOSTILE_BODIES = {  # each under the shop's 64 KiB limit, so each must reach the JSON reader
    "deep-list": b"[" * 30_000 + b"]" * 30_000,
    "deep-object": b'{"a":' * 5_000 + b"1" + b"}" * 5_000,
    "lone-surrogate": b'{"queries": ["\\ud800 x"], "action": "search[\\udfff]", "split": "\\ud83d"}',
    "malformed": b'{"queries": ["a"',
    "nan": b'{"queries": ["a"], "topk": NaN, "goal": NaN}',
    "not-utf8": b'{"action": "\xff\xfe"}',
    "not-an-object": b'["action"]',
    "huge-integer": b'{"topk": ' + b"9" * 5_000 + b', "goal": 1}',  # json refuses > 4,300 digits
}


# ------------------------------------------------------------------------------- Search-QA: item 3 and 4


@pytest.fixture(scope="module")
def search_url(tiny_index: tuple[Any, Path]) -> Iterator[str]:
    _, folder = tiny_index
    with serving(create_search_app(DenseRetriever(folder, encoder=HashingEncoder().encode))) as url:
        yield url


def test_search_a_10mb_body_is_413_before_it_is_read(search_url: str) -> None:
    started = time.perf_counter()
    # the server must answer from the declared length alone: only the first 64 KiB are ever sent
    status, ctype, body = send(search_url, "/retrieve", [b'{"queries": ["' + b"x" * 65_536],
                               content_length=10_000_000)
    elapsed = time.perf_counter() - started
    assert status == 413 and ctype.startswith("application/json") and "at most" in json.loads(body)["error"]
    assert elapsed < 2.0, f"413 took {elapsed:.2f}s"


def test_search_an_oversize_chunked_body_is_413_not_cut(search_url: str) -> None:
    chunk = b"x" * 65_536
    started = time.perf_counter()
    status, _, body = send(search_url, "/retrieve", [b'{"queries": ["'] + [chunk] * 40 + [b'"]}'])
    assert status == 413 and "at most" in json.loads(body)["error"]
    assert time.perf_counter() - started < 5.0


def test_search_too_many_query_characters_is_413_with_a_reason(search_url: str) -> None:
    status, reply = post_json(search_url, "/retrieve", {"queries": ["word " * 400] * 60, "topk": 1})
    assert status == 413 and "characters" in reply["error"] and "split" in reply["error"]


@pytest.mark.parametrize("name", sorted(HOSTILE_BODIES))
def test_search_hostile_json_is_a_json_400(search_url: str, name: str) -> None:
    status, ctype, body = send(search_url, "/retrieve", [HOSTILE_BODIES[name]],
                               content_length=len(HOSTILE_BODIES[name]))
    assert status == 400 and ctype.startswith("application/json") and json.loads(body)["error"]


def test_search_unknown_routes_and_failures_are_json(tiny_index: tuple[Any, Path]) -> None:
    _, folder = tiny_index

    def broken(texts: Sequence[str]) -> np.ndarray:
        raise RuntimeError("secret detail")

    with serving(create_search_app(DenseRetriever(folder, encoder=broken))) as url:
        status, reply = post_json(url, "/retrieve", {"queries": ["a"], "topk": 1})
        assert status == 500 and "secret" not in reply["error"]
        status, ctype, _ = send(url, "/nowhere", [b"{}"], content_length=2)
        assert status == 404 and ctype.startswith("application/json")


def test_http_client_splits_lists_the_server_would_refuse(search_url: str) -> None:
    queries = [f"city {i}" for i in range(1_100)] + ["long query " * 200] * 60  # > 1,024 and > 100k chars
    hits = HttpRetriever(search_url).retrieve(queries, 1)
    assert len(hits) == len(queries) and all(len(h) == 1 for h in hits)


class CountingEncoder:
    """HashingEncoder that counts its calls and takes `delay_s` per call, like a real model would."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s, self.calls = delay_s, 0
        self.sizes: list[int] = []
        self._inner = HashingEncoder()

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        self.calls += 1  # only ever one caller at a time: the batcher guarantees it
        self.sizes.append(len(texts))
        time.sleep(self.delay_s)
        return self._inner.encode(texts)


def test_search_concurrent_requests_share_encoder_calls(tiny_index: tuple[Any, Path]) -> None:
    data, folder = tiny_index
    encoder = CountingEncoder(delay_s=1.0)  # long enough for all 16 to queue on a loaded machine
    reference = DenseRetriever(folder, encoder=HashingEncoder().encode)
    queries = [[p.contents, "capital of " + p.title] for p in data.passages[:16]]
    replies: dict[int, tuple[int, Any]] = {}
    gate = threading.Barrier(len(queries))

    def ask(i: int) -> None:
        gate.wait(timeout=30)
        replies[i] = post_json(url, "/retrieve", {"queries": queries[i], "topk": 2})

    with serving(create_search_app(DenseRetriever(folder, encoder=encoder))) as url:
        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(queries))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    for i, qs in enumerate(queries):
        status, reply = replies[i]
        want = [[h.passage.id for h in hits] for hits in reference.retrieve(qs, 2)]
        assert status == 200 and [[d["id"] for d in hits] for hits in reply["result"]] == want
    assert sum(encoder.sizes) == 2 * len(queries)
    assert encoder.calls < len(queries), f"{encoder.calls} encoder calls for {len(queries)} requests"


def test_batcher_gives_each_caller_its_rows_or_its_error() -> None:
    calls: list[list[str]] = []
    release = threading.Event()  # the first call is held until then, so the others queue behind it
    batcher = EncodeBatcher(held_first_call_encoder(calls, release), max_texts=4)
    results: dict[str, Any] = {}

    def run(name: str, texts: list[str]) -> None:
        try:
            results[name] = batcher(texts).ravel().tolist()
        except ValueError as exc:
            results[name] = str(exc)

    threads = [threading.Thread(target=run, args=("first", ["0"]))]
    threads[0].start()
    deadline = time.monotonic() + 30
    while not calls and time.monotonic() < deadline:
        time.sleep(0.01)
    for i, item in enumerate({"a": ["1", "2"], "d": ["fail"], "b": ["3"], "c": ["4", "5", "6", "7", "8"]}.items()):
        threads.append(threading.Thread(target=run, args=item))
        threads[-1].start()
        while len(batcher._queue) <= i and time.monotonic() < deadline:  # queue them in this order
            time.sleep(0.01)
    release.set()
    for t in threads:
        t.join(timeout=30)
    assert results == {"first": [0.0], "a": [1.0, 2.0], "b": [3.0], "d": "cannot encode",
                       "c": [4.0, 5.0, 6.0, 7.0, 8.0]}  # c: more than max_texts, still encoded in one call
    # a, d and b went out together; that failed, so each was encoded alone; c came last, on its own
    assert calls == [["0"], ["1", "2", "fail", "3"], ["1", "2"], ["fail"], ["3"], ["4", "5", "6", "7", "8"]]


# ------------------------------------------------------------------------------------ Search-QA: item 1

_EXPLODING_SERVER = server_with_encoder("""
def encode(texts):
    if "explode" in texts:
        raise RuntimeError("boom")
    return HashingEncoder().encode(texts)
""")


def test_search_serve_main_never_shows_the_debugger(tiny_index: tuple[Any, Path], tmp_path: Path) -> None:
    """With FLASK_DEBUG=1, app.run() would serve Werkzeug's debugger (a Python console on every 500 page)."""
    _, folder = tiny_index
    env = {**os.environ, "FLASK_DEBUG": "1", "PYTHONUNBUFFERED": "1"}
    stderr_path = tmp_path / "server.stderr"
    with stderr_path.open("w") as stderr:
        proc = subprocess.Popen([sys.executable, "-c", STACKS_ON_SIGUSR1 + _EXPLODING_SERVER, "--index", str(folder),
                                 "--port", "0"], stdout=subprocess.PIPE, stderr=stderr, text=True, env=env,
                                preexec_fn=ignore_sigint)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the banner; the process exits (empty line) if it cannot start
        match = re.search(r"http://\S+", line)
        assert match, f"no banner, got {line!r}"
        url = match.group(0)
        status, ctype, body = send(url, "/retrieve", [b'{"queries": ["explode"]}'], content_length=24)
        assert status == 500 and ctype.startswith("application/json")
        assert b"Traceback" not in body and b"debugger" not in body.lower() and b"boom" not in body
        status, _, body = send(url, "/?__debugger__=yes&cmd=resource&f=debugger.js", [], content_length=0,
                               method="GET")
        assert status in (404, 405) and b"debugger" not in body.lower()
        proc.send_signal(signal.SIGINT)  # stops it although it started with SIGINT ignored
        assert wait_or_show_stacks(proc, stderr_path, timeout=180) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


# ------------------------------------------------------------------------------------ build_index: item 2


class _FakeMiniLM:
    """Stands in for the MiniLM encoder so build_index runs in a blink."""

    def __init__(self, **_: Any) -> None:
        self.encode = HashingEncoder().encode


def _build(monkeypatch: pytest.MonkeyPatch, *argv: str) -> int:
    from agentgym_opsd.environments.search_qa import build_index, embedding

    monkeypatch.setattr(embedding, "MiniLMEncoder", _FakeMiniLM)
    return build_index.main(list(argv))


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _hidden_leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("where", ["named", "cwd"])
def test_build_index_refuses_a_folder_that_is_not_an_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str], where: str) -> None:
    victim = tmp_path / "victim"
    (victim / "sub").mkdir(parents=True)
    (victim / "precious.txt").write_text("keep me")
    (victim / "meta.json").write_text('{"num_passages": 1, "dim": 3, "kind": "flat"}')  # ours in name only
    if where == "cwd":
        monkeypatch.chdir(victim)
    with pytest.raises(SystemExit) as exit_:
        _build(monkeypatch, "--generate", "tiny", "--out", "." if where == "cwd" else str(victim))
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "not a Search-QA index" in err and "precious.txt" in err and "Traceback" not in err
    assert (victim / "precious.txt").read_text() == "keep me" and (victim / "sub").is_dir()
    assert _hidden_leftovers(tmp_path) == []


def test_build_index_refuses_a_file_and_a_missing_corpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("x")
    for argv, message in [(["--generate", "tiny", "--out", str(tmp_path / "notes.txt")], "not a folder"),
                          (["--corpus", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "i")], "no such file"),
                          (["--generate", "tiny", "--out", str(tmp_path / "i"), "--batch-size", "0"], ">= 1")]:
        with pytest.raises(SystemExit) as exit_:
            _build(monkeypatch, *argv)
        assert exit_.value.code == 2 and message in capsys.readouterr().err
    assert (tmp_path / "notes.txt").read_text() == "x"


def test_build_index_replaces_its_own_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "idx"
    assert _build(monkeypatch, "--generate", "tiny", "--out", str(out)) == 0
    first = _snapshot(out)
    assert {"meta.json", "index.faiss", "train.jsonl", "test.jsonl"} <= first.keys()
    (out / "meta.json").write_text(first["meta.json"].decode().replace('"kind"', '"marker": 1, "kind"'))
    assert _build(monkeypatch, "--generate", "tiny", "--out", str(out), "--kind", "hnsw") == 0
    second = _snapshot(out)
    assert second.keys() == first.keys() and b'"marker"' not in second["meta.json"]
    assert json.loads(second["meta.json"])["kind"] == "hnsw" and second["corpus.jsonl"] == first["corpus.jsonl"]
    assert _hidden_leftovers(tmp_path) == []


def test_a_crash_mid_build_leaves_the_old_index(tmp_path: Path, tiny_index: tuple[Any, Path],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from agentgym_opsd import files as files_module

    data, _ = tiny_index
    out = write_index_folder(tmp_path / "idx", data.passages[:50], HashingEncoder().encode,
                             IndexConfig(kind="flat"), progress=False)
    before = _snapshot(out)
    calls = []

    def dies_midway(texts: Sequence[str]) -> np.ndarray:
        calls.append(len(texts))
        if len(calls) == 2:
            raise KeyboardInterrupt  # the user gives up, or the machine runs out of memory
        return HashingEncoder().encode(texts)

    with pytest.raises(KeyboardInterrupt):
        write_index_folder(out, data.passages, dies_midway, IndexConfig(kind="flat"), batch_size=16,
                           progress=False, overwrite=True)
    assert _snapshot(out) == before and _hidden_leftovers(tmp_path) == []

    real_rename = os.rename
    failed: list[Any] = []

    def swap_fails(src: Any, dst: Any) -> None:  # the rename that puts the new folder in place fails once;
        if Path(dst) == out and not failed:  # moving the old index back works
            failed.append(src)
            raise OSError("disk trouble")
        real_rename(src, dst)

    monkeypatch.setattr(files_module.os, "rename", swap_fails)
    with pytest.raises(OSError, match="disk trouble"):
        write_index_folder(out, data.passages, HashingEncoder().encode, IndexConfig(kind="flat"),
                           progress=False, overwrite=True)
    monkeypatch.undo()
    assert _snapshot(out) == before and _hidden_leftovers(tmp_path) == []
    assert len(DenseRetriever(out, encoder=HashingEncoder().encode).index) == 50


# ------------------------------------------------------------------------------- WebShop: items 4 and 5


@pytest.fixture(scope="module")
def shop_url() -> Iterator[str]:
    from agentgym_opsd.environments.webshop.server import ShopServer

    with ShopServer(small_shop()) as srv:
        yield srv.url


def _new_session(url: str) -> str:
    status, reply = post_json(url, "/api/sessions", {"split": "test", "goal": 0})
    assert status == 200
    return reply["sid"]


def _state(url: str, sid: str) -> dict[str, Any]:
    status, _, body = send(url, f"/s/{sid}/state.json", [], content_length=0, method="GET")
    assert status == 200
    return json.loads(body)


@pytest.mark.parametrize("name", sorted(HOSTILE_BODIES))
@pytest.mark.parametrize("chunked", [False, True])
def test_shop_hostile_json_is_a_json_400(shop_url: str, name: str, chunked: bool) -> None:
    sid = _new_session(shop_url)
    body = HOSTILE_BODIES[name]
    for path in ("/api/sessions", f"/api/sessions/{sid}/step"):
        status, ctype, reply = send(shop_url, path, [body], content_length=None if chunked else len(body))
        assert status == 400 and ctype.startswith("application/json") and json.loads(reply)["error"], path


@pytest.mark.parametrize("url_fixture", ["shop_url", "search_url"])
def test_100k_open_brackets_are_refused_with_json(url_fixture: str, request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue(url_fixture)
    path = f"/api/sessions/{_new_session(url)}/step" if url_fixture == "shop_url" else "/retrieve"
    status, ctype, reply = send(url, path, [b"[" * 100_000], content_length=100_000)
    assert status in (400, 413) and ctype.startswith("application/json") and json.loads(reply)["error"]


def test_shop_oversize_chunked_json_is_413_not_cut(shop_url: str) -> None:
    sid = _new_session(shop_url)
    action = json.dumps({"action": "search[" + "q" * 100_000 + "]"}).encode()
    parts = [action[i:i + 8192] for i in range(0, len(action), 8192)]
    status, ctype, reply = send(shop_url, f"/api/sessions/{sid}/step", parts)
    assert status == 413 and ctype.startswith("application/json") and "at most" in json.loads(reply)["error"]
    assert _state(shop_url, sid)["num_searches"] == 0


@pytest.mark.parametrize("route, field", [("search", "query"), ("click", "name")])
def test_shop_oversize_chunked_form_is_413_not_a_truncated_action(shop_url: str, route: str, field: str) -> None:
    sid = _new_session(shop_url)
    form = f"{field}=".encode() + b"shoes+" * 20_000
    parts = [form[i:i + 8192] for i in range(0, len(form), 8192)]
    status, ctype, _ = send(shop_url, f"/s/{sid}/{route}", parts, content_type="application/x-www-form-urlencoded")
    assert status == 413 and ctype.startswith("application/json")  # the connection layer's, from the chunk sizes
    assert _state(shop_url, sid)["num_searches"] == 0
    # a small chunked form still works: the body is read, not dropped
    status, _, _ = send(shop_url, f"/s/{sid}/search", [b"query=olive", b"+oil"],
                        content_type="application/x-www-form-urlencoded")
    assert status == 303 and _state(shop_url, sid)["num_searches"] == 1


def test_shop_empty_body_still_means_defaults(shop_url: str) -> None:
    status, _, reply = send(shop_url, "/api/sessions", [], content_length=0)
    assert status == 200 and json.loads(reply)["sid"]
    status, _, reply = send(shop_url, "/api/sessions", [])  # chunked, no chunks
    assert status == 200 and json.loads(reply)["sid"]


def test_shop_failures_are_json_on_the_api_and_html_on_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentgym_opsd.environments.webshop.server import ShopServer
    from agentgym_opsd.environments.webshop.session import ShopSession

    monkeypatch.setenv("FLASK_DEBUG", "1")

    def explode(self: Any, action: str) -> Any:
        raise RuntimeError("secret detail")

    with ShopServer(small_shop()) as srv:
        sid = _new_session(srv.url)
        monkeypatch.setattr(ShopSession, "act", explode)
        status, reply = post_json(srv.url, f"/api/sessions/{sid}/step", {"action": "search[x]"})
        assert status == 500 and "secret" not in reply["error"]
        status, ctype, body = send(srv.url, f"/s/{sid}/search", [b"query=x"],
                                   content_type="application/x-www-form-urlencoded", content_length=7)
        assert status == 500 and ctype.startswith("text/html") and b"Traceback" not in body
        status, ctype, _ = send(srv.url, "/api/nowhere", [], content_length=0, method="PUT")
        assert status == 404 and ctype.startswith("application/json")


# -------------------------------------------------------------------------------- command lines: item 6


@pytest.mark.parametrize("argv, message", [
    (["--port", "99999"], "65535"),
    (["--port", "-1"], "65535"),
    (["--session-ttl", "0"], "> 0"),
    (["--session-ttl", "nan"], "> 0"),
    (["--max-sessions", "0"], ">= 1"),
    (["--num-products", "0"], ">= 1"),
    (["--data-dir", "/etc"], "items_shuffle*.json, items_ins_v2*.json"),
    (["--data-dir", "/no/such/folder"], "no such folder"),
])
def test_shop_serve_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    from agentgym_opsd.environments.webshop import serve

    with pytest.raises(SystemExit) as exit_:
        serve.main(argv)
    last = capsys.readouterr().err.strip().splitlines()[-1]  # usage, then one line saying what is wrong
    assert exit_.value.code == 2 and "error:" in last and message in last


def test_shop_serve_refuses_unreadable_real_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from agentgym_opsd.environments.webshop import serve

    (tmp_path / "items_shuffle_1000.json").write_text("{not json")
    (tmp_path / "items_ins_v2_1000.json").write_text("{}")
    with pytest.raises(SystemExit) as exit_:
        serve.main(["--data-dir", str(tmp_path)])
    assert exit_.value.code == 2 and "cannot read JSON" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--port", "99999"], "65535"),
    (["--index", "{missing}"], "no such folder"),
    (["--index", "{empty}"], "not a complete index folder"),
])
def test_search_serve_usage_errors(argv: list[str], message: str, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    from agentgym_opsd.environments.search_qa import serve

    (tmp_path / "empty").mkdir()
    argv = [a.format(missing=tmp_path / "missing", empty=tmp_path / "empty") for a in argv]
    with pytest.raises(SystemExit) as exit_:
        serve.main(argv if "--index" in argv else ["--index", str(tmp_path), *argv])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_.value.code == 2 and "error:" in last and message in last


def test_shop_split_without_goals_is_a_400_not_a_crash() -> None:
    from agentgym_opsd.environments.webshop.server import ShopServer
    from agentgym_opsd.environments.webshop.shop import Shop

    with ShopServer(Shop.generated(1)) as srv:  # one product: its goal is in test, train has none
        status, reply = post_json(srv.url, "/api/sessions", {"split": "train"})
        assert status == 400 and "no goals" in reply["error"]
        assert post_json(srv.url, "/api/sessions", {"split": "test"})[0] == 200


def test_a_killed_index_build_leaves_nothing_the_next_build_keeps(tmp_path) -> None:
    import subprocess
    import sys

    from agentgym_opsd.environments.search_qa.embedding import HashingEncoder
    from agentgym_opsd.environments.search_qa.generator import generate_dataset
    from agentgym_opsd.environments.search_qa.index import IndexConfig, write_index_folder

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    leftover = tmp_path / f".idx.{dead.pid}.0badc0de.tmp"  # what kill -9 mid-build leaves: a whole index
    (leftover / "sub").mkdir(parents=True)
    live = tmp_path / f".idx.{os.getpid()}.0badc0de.tmp"  # a build still running in another process
    live.mkdir()
    data = generate_dataset("tiny")
    write_index_folder(tmp_path / "idx", data.passages[:20], HashingEncoder().encode, IndexConfig(kind="flat"),
                       progress=False)
    assert not leftover.exists() and live.exists() and (tmp_path / "idx").is_dir()
