"""A policy backed by any OpenAI-compatible chat-completions endpoint (`openai:URL`).

Each request of a batch is one `POST {URL}/v1/chat/completions`, sent concurrently. A request that times
out, fails to connect, gets a 5xx/429 answer or a body that is not a chat completion is retried
(`max_retries` times, with a short backoff); if it still fails, its `PolicyOutput` carries `error` with the
reason, and the rollout ends that episode flagged (the evaluation runner then replays the episode a bounded
number of times). Remote policies return no token ids or log-probs.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import re
import time
from collections.abc import Sequence
from typing import Any

import requests

from agentgym_opsd.policies import PolicyOutput, PolicyRequest
from agentgym_opsd.records import ChatMessage

__all__ = ["OpenAIChatPolicy", "RemotePolicyError", "chat_completions_url", "MODEL_ENV", "KEY_ENV"]

MODEL_ENV = "AGENTGYM_OPSD_OPENAI_MODEL"
"""Environment variable naming the model when no `model=` option is given."""
KEY_ENV = "OPENAI_API_KEY"
"""Environment variable holding the bearer token (optional: local servers need none)."""

# HTTP statuses worth retrying: the server is busy or broke for a moment. Other 4xx mean the request
# itself is wrong, and sending it again cannot help.
_RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
_OPEN_TAG = re.compile(r"<([a-z_][a-z0-9_]*)>", re.IGNORECASE)


class RemotePolicyError(RuntimeError):
    """The endpoint could not give a usable answer (after retries)."""


def chat_completions_url(url: str) -> str:
    """`http://h:p`, `http://h:p/v1` or the full `.../v1/chat/completions` -> the full URL."""
    url = url.strip().rstrip("/")
    if not re.match(r"^https?://", url):
        raise ValueError(f"openai endpoint must be an http(s) URL, got {url!r}")
    if url.endswith("/chat/completions"):
        return url
    if url.endswith("/v1"):
        return url + "/chat/completions"
    return url + "/v1/chat/completions"


class OpenAIChatPolicy:
    """Chat-completions client implementing the `Policy` protocol.

    `model`: the model name sent to the endpoint (default: `$AGENTGYM_OPSD_OPENAI_MODEL`, else the first
    model listed by `GET /v1/models`). `api_key`: bearer token (default `$OPENAI_API_KEY`, may be unset).
    `timeout_s`: per HTTP request; `max_retries`: extra attempts per request; `concurrency`: requests in
    flight at once. `stop`: stop strings sent to the endpoint (the endpoint drops them from the text, so a
    closing tag cut that way is restored).
    """

    def __init__(
        self,
        url: str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        temperature: float = 0.4,
        max_tokens: int = 512,
        top_p: float = 1.0,
        timeout_s: float = 60.0,
        max_retries: int = 2,
        backoff_s: float = 0.5,
        concurrency: int = 8,
        stop: Sequence[str] | None = None,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        self.url = chat_completions_url(url)
        self.base_url = self.url.removesuffix("/chat/completions")
        self.spec = f"openai:{url}"
        self.api_key = api_key if api_key is not None else os.environ.get(KEY_ENV) or None
        self.temperature = float(temperature)
        self.max_tokens = int(max_tokens)
        self.top_p = float(top_p)
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.stop = list(stop) if stop else None
        self._session = requests.Session()
        self._executor = cf.ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="openai-policy")
        self._model = model or os.environ.get(MODEL_ENV) or None

    # ---- Policy protocol -------------------------------------------------------------------------------
    def act(self, requests_: Sequence[PolicyRequest]) -> list[PolicyOutput]:
        futures = [self._executor.submit(self._answer, req.messages) for req in requests_]
        return [f.result() for f in futures]

    def set_temperature(self, temperature: float) -> None:
        self.temperature = float(temperature)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._session.close()

    # ---- internals ---------------------------------------------------------------------------------------
    @property
    def model(self) -> str:
        """The model name; asks the endpoint's `/v1/models` once when none was configured."""
        if self._model is None:
            self._model = self._first_listed_model()
        return self._model

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def _first_listed_model(self) -> str:
        try:
            resp = self._session.get(self.base_url + "/models", headers=self._headers(), timeout=self.timeout_s)
            resp.raise_for_status()
            models = resp.json().get("data") or []
            return str(models[0]["id"])
        except (requests.RequestException, ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise RemotePolicyError(
                f"no model name given and {self.base_url}/models lists none ({exc}); pass model=... or set "
                f"${MODEL_ENV}"
            ) from exc

    def _answer(self, messages: list[ChatMessage]) -> PolicyOutput:
        reason = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.backoff_s * attempt)
            try:
                return PolicyOutput(self._complete(messages))
            except _Retryable as exc:
                reason = str(exc)
            except RemotePolicyError as exc:
                return PolicyOutput("", error=str(exc))
        return PolicyOutput("", error=f"{reason} (after {self.max_retries + 1} attempts)")

    def _complete(self, messages: list[ChatMessage]) -> str:
        body: dict[str, Any] = {"model": self.model, "messages": messages, "temperature": self.temperature,
                                "max_tokens": self.max_tokens, "top_p": self.top_p}
        if self.stop:
            body["stop"] = self.stop
        try:
            resp = self._session.post(self.url, json=body, headers=self._headers(), timeout=self.timeout_s)
        except requests.Timeout as exc:
            raise _Retryable(f"endpoint timed out after {self.timeout_s:.1f}s") from exc
        except requests.ConnectionError as exc:
            raise _Retryable(f"cannot connect to {self.url} ({type(exc).__name__})") from exc
        if resp.status_code in _RETRY_STATUS:
            raise _Retryable(f"endpoint answered HTTP {resp.status_code}: {resp.text[:200]!r}")
        if resp.status_code != 200:
            raise RemotePolicyError(f"endpoint answered HTTP {resp.status_code}: {resp.text[:200]!r}")
        return self._parse(resp)

    def _parse(self, resp: requests.Response) -> str:
        try:
            data = resp.json()
            choice = data["choices"][0]
            content = choice["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise _Retryable(f"endpoint returned garbage, not a chat completion: {resp.text[:200]!r}") from exc
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise _Retryable(f"endpoint returned non-text content: {str(content)[:200]!r}")
        if self.stop and choice.get("finish_reason") == "stop":
            content = _close_cut_tag(content)
        return content


class _Retryable(RemotePolicyError):
    """A failure that may pass on the next attempt (timeout, connection, 5xx, garbage body)."""


def _close_cut_tag(text: str) -> str:
    """Endpoints drop the stop string: `<action>go north` stopped at `</action>` gets its tag back."""
    opened = list(_OPEN_TAG.finditer(text))
    if opened:
        tag = opened[-1].group(1)
        if f"</{tag.lower()}>" not in text[opened[-1].end() :].lower():
            return f"{text}</{tag}>"
    return text
