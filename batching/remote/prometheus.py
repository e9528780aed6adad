"""The one reader of a server's Prometheus `/metrics`: fetched over HTTP and read with Prometheus' own parser into
each sample by its name (`_total` counters under their full name) with its labels.

Every caller reads its figures from here: the remote view's telemetry (`telemetry.parse_metrics`, each engine's
names), the bench's peers counting their server's engine steps (vLLM's `iteration_tokens_total`, llama.cpp's
`n_decode_total`), and `steady` counting our server's steps by path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import httpx2
from prometheus_client.parser import text_string_to_metric_families

READ_TIMEOUT_S = 10.0
ABSENT = (404, 405, 501)  # how servers without a /metrics page answer


class MetricsUnavailable(Exception):
    """The server has no `/metrics` page (it answered 404, 405 or 501, or an empty page)."""


@dataclass(frozen=True)
class Sample:
    """One sample of a page: its labels and its value."""

    labels: dict[str, str]
    value: float


@dataclass(frozen=True)
class MetricsPage:
    """Every sample of one `/metrics` page by its name, in page order; `_created` stamps and NaNs left out."""

    samples: dict[str, list[Sample]] = field(default_factory=dict)

    def names(self) -> list[str]:
        return list(self.samples)

    def values(self, name: str) -> list[float]:
        """Each sample's value under `name` (one per label set); empty when the page has none."""
        return [sample.value for sample in self.samples.get(name, ())]

    def total(self, name: str) -> float | None:
        """The sum over every label set of `name` (engines, ranks, reasons), or None when the page has none."""
        return sum(self.values(name)) if name in self.samples else None

    def by_label(self, name: str, label: str) -> dict[str, float]:
        """The samples of `name` by the value of their `label` (those without it left out)."""
        return {sample.labels[label]: sample.value for sample in self.samples.get(name, ()) if label in sample.labels}


def parse_page(text: str) -> MetricsPage:
    """A page in Prometheus' text format; ValueError (Prometheus' parser's message) when it is not one."""
    samples: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created") or math.isnan(sample.value):
                continue
            samples.setdefault(sample.name, []).append(Sample(dict(sample.labels), float(sample.value)))
    return MetricsPage(samples)


def read_metrics(root: str, client: httpx2.Client | None = None, timeout_s: float = READ_TIMEOUT_S) -> MetricsPage:
    """GET `root`/metrics (through `client`, with its headers and timeouts, else a request of its own) and parse it.

    Raises MetricsUnavailable when the server has no such page, httpx2.HTTPStatusError for any other answer but
    200, httpx2.HTTPError when it cannot be reached, and ValueError when the page is not in Prometheus' format."""
    url = f"{root}/metrics"
    answer = client.get(url) if client is not None else httpx2.get(url, timeout=timeout_s)
    if answer.status_code in ABSENT or (answer.status_code == 200 and not answer.content):
        raise MetricsUnavailable(f"{root} has no /metrics (HTTP {answer.status_code})")
    answer.raise_for_status()
    return parse_page(answer.text)
