"""A fleet: replicas behind a router. Requests go through the router; each replica's own `/metrics` says what it
holds. The replicas are given, or read from the router where it lists its workers: `GET /workers` (sglang-router,
and vllm-router 0.1.17: `{"workers": [{"url": ...}]}`) or vllm-router's `GET /list_workers` (`{"urls": [...]}`).
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit

import httpx2

from batching.remote.endpoint import Endpoint, RemoteError, describe_failure, parse_url

_LISTS = ("/workers", "/list_workers")


def replica_name(root: str) -> str:
    """A replica as the charts name it: its host and port."""
    return urlsplit(root).netloc or root


def worker_urls(answer: object) -> tuple[str, ...] | None:
    """The worker URLs of a router's list (either shape above), or None when `answer` is neither."""
    if isinstance(answer, dict) and isinstance(answer.get("workers"), list):
        urls = [worker.get("url") for worker in answer["workers"] if isinstance(worker, dict)]
    elif isinstance(answer, dict) and isinstance(answer.get("urls"), list):
        urls = list(answer["urls"])
    else:
        return None
    return tuple(url for url in urls if isinstance(url, str) and url)


def discover_replicas(router: Endpoint) -> tuple[str, ...]:
    """The root addresses of the router's workers, from its own list; RemoteError when it lists none."""
    with httpx2.Client(timeout=router.timeout(), headers=router.headers()) as client:
        for path in _LISTS:
            try:
                answer = client.get(router.root + path)
            except httpx2.HTTPError as exc:
                raise RemoteError(describe_failure(exc, router)) from None
            if answer.status_code != 200:
                continue
            try:
                urls = worker_urls(answer.json())
            except ValueError:
                continue
            if urls:
                return tuple(parse_url(url) for url in urls)
    raise RemoteError(
        f"{router.root} lists no workers at /workers or /list_workers: give each replica's address (--replica URL)"
    )


def replica_endpoints(router: Endpoint, replicas: Sequence[str]) -> tuple[Endpoint, ...]:
    """Each replica's endpoint (the router's key and timeouts): those given, else the router's own list."""
    roots = tuple(parse_url(url) for url in replicas) if replicas else discover_replicas(router)
    return tuple(
        Endpoint(root, router.api_key, router.connect_timeout_s, router.read_timeout_s, router.request_timeout_s)
        for root in roots
    )
