"""Where a remote OpenAI-compatible server is, how long to wait for it, and one clear line for each way it fails.

Every message here names the address and says what to do, so the page can show it as is: a bad URL, a port with
nothing listening, a refused key (401), a path that is not an OpenAI API, a stream the server dropped mid-answer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx2

from config.settings import RemoteSettings

_API_SUFFIXES = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/v1")
LOCAL_TIMEOUT_S = 600.0


class RemoteError(Exception):
    """A remote server could not be used; the message is one line naming the address and what to do."""


@dataclass(frozen=True)
class Endpoint:
    """A server's root address (no `/v1`), its API key, and the timeouts every request to it uses."""

    root: str
    api_key: str | None = None
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 60.0  # the longest wait for the next bytes of an answer
    request_timeout_s: float = 600.0  # the longest one answer may take, start to end

    @property
    def api(self) -> str:
        return self.root + "/v1"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def timeout(self) -> httpx2.Timeout:
        return httpx2.Timeout(self.read_timeout_s, connect=self.connect_timeout_s)


def endpoint_from_settings(settings: RemoteSettings, url: str, api_key: str | None = None) -> Endpoint:
    """The endpoint at `url` (typed or from the settings) with the settings' timeouts; RemoteError if the URL is bad."""
    return Endpoint(
        parse_url(url),
        api_key or None,
        settings.connect_timeout_s,
        settings.read_timeout_s,
        settings.request_timeout_s,
    )


def local_endpoint(url: str) -> Endpoint:
    """A server on this machine that a benchmark started (a peer's, the sweep's): as long a wait for its next bytes
    as for a whole answer, since a busy CPU server may take minutes to its first token."""
    return Endpoint(url, connect_timeout_s=10.0, read_timeout_s=LOCAL_TIMEOUT_S, request_timeout_s=LOCAL_TIMEOUT_S)


def parse_url(text: str) -> str:
    """The server's root address from what a person typed (`http://host:8000`, `.../v1`, a trailing slash), or a
    RemoteError saying what is allowed."""
    typed = text.strip()
    shown = typed if len(typed) <= 80 else typed[:77] + "..."
    parts = urlsplit(typed)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RemoteError(f"{shown!r} is not a server address: type http://host:port or https://host[:port]")
    try:
        parts.port  # noqa: B018 (a port out of range raises here)
    except ValueError:
        raise RemoteError(f"{shown!r} has a port that is not allowed: use a number from 1 to 65535") from None
    if parts.query or parts.fragment:
        raise RemoteError(f"{shown!r} is not a server address: leave out the ?query and #fragment")
    path = parts.path.rstrip("/")
    for suffix in _API_SUFFIXES:
        if path.endswith(suffix):
            path = path[: -len(suffix)]
            break
    return f"{parts.scheme}://{parts.netloc}{path}"


def describe_failure(exc: BaseException, endpoint: Endpoint) -> str:
    """One line for a request that failed before or while its answer streamed (httpx2's exceptions mapped)."""
    where = endpoint.root
    if isinstance(exc, RemoteError):
        return str(exc)
    if isinstance(exc, httpx2.ConnectTimeout):
        return f"no answer from {where} within {endpoint.connect_timeout_s:g} s: is the address right and reachable?"
    if isinstance(exc, httpx2.ConnectError):
        return f"cannot connect to {where} (connection refused or host unknown): is the server running on that port?"
    if isinstance(exc, httpx2.ReadTimeout):
        return f"{where} sent nothing for {endpoint.read_timeout_s:g} s (BATCHSCOPE_REMOTE__READ_TIMEOUT_S)"
    if isinstance(exc, TimeoutError):
        return f"the answer took longer than {endpoint.request_timeout_s:g} s (BATCHSCOPE_REMOTE__REQUEST_TIMEOUT_S)"
    if isinstance(exc, httpx2.RemoteProtocolError | httpx2.ReadError):
        return f"{where} closed the connection mid-answer: the server stopped or dropped the stream"
    return f"request to {where} failed: {type(exc).__name__}: {str(exc)[:160]}"


def describe_status(status: int, body: str, endpoint: Endpoint, path: str) -> str:
    """One line for an HTTP error answer: the server's own message when it gives one, and what to do."""
    detail = _error_detail(body)
    if status in (401, 403):
        return (
            f"{endpoint.root} refused the API key (HTTP {status}): set the right key in the sidebar or "
            "BATCHSCOPE_REMOTE__API_KEY"
        )
    if status == 404:
        return f"{endpoint.root}{path} does not exist (HTTP 404): is this an OpenAI-compatible server at that address?"
    suffix = f": {detail}" if detail else ""
    return f"{endpoint.root}{path} answered HTTP {status}{suffix}"


def _error_detail(body: str) -> str:
    """The message of an OpenAI-style error body (`{"error": {"message": ...}}`, or FastAPI's `detail`), short."""
    try:
        data = json.loads(body)
    except ValueError:
        return body.strip().splitlines()[0][:200] if body.strip() else ""
    if isinstance(data, dict):
        error = data.get("error", data.get("detail", data.get("message")))
        if isinstance(error, dict):
            error = error.get("message", error)
        return str(error)[:200] if error is not None else ""
    return ""


def fetch_model(endpoint: Endpoint) -> str:
    """The first model id the server lists at `/v1/models`, or a RemoteError saying why there is none."""
    try:
        with httpx2.Client(timeout=endpoint.timeout(), headers=endpoint.headers()) as client:
            answer = client.get(endpoint.api + "/models")
    except httpx2.HTTPError as exc:
        raise RemoteError(describe_failure(exc, endpoint)) from None
    if answer.status_code != 200:
        raise RemoteError(describe_status(answer.status_code, answer.text, endpoint, "/v1/models"))
    try:
        models = answer.json()["data"]
        return str(models[0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise RemoteError(
            f"{endpoint.api}/models lists no model: type the model's name (BATCHSCOPE_REMOTE__MODEL)"
        ) from None
