"""Which decode graph a step of so many rows runs on, where a model has two: the main one (the kernels autotuning
chose: oneDNN's packed matmuls beside inductor's C++ GEMM templates) and one whose linear layers are the C++
templates alone (`compiled.templates_beside`). Chosen by timing the steps themselves.

A decode step of a model with large matrices streams every weight once, and which kernel streams them faster
depends on the rows: measured at the 0.5B shape on two threads (2-vCPU AMD EPYC, 2026-11-28, decode steps alone,
median ms at 1 to 8 rows), the main graph 59.8 / 52.5 / 39.2 / 38.4 / 38.6 / 40.3 / 60.5 / 68.0, the templates'
46.3 / 28.7 / 30.4 / 31.6 / 32.9 / 36.3 / 74.9 / 81.8. Where the crossing lies depends on the CPU (its vector units,
its memory) and on the load, so each row count's first steps alternate between the two graphs, and the one whose
fastest recent step was faster runs the rest; every `REFRESH` steps of that row count the other runs once, so a
choice follows the machine.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Literal

Graph = Literal["main", "templates"]
SAMPLES = 3  # each graph's last steps kept per row count: the fastest of these is compared (a step the machine
# slowed, another process taking the core, is not what the graph costs)
REFRESH = 64  # after the first samples, the graph not chosen runs one step in this many


@dataclass
class GraphChoice:
    """Per row count, the recent step times of each graph, and which graph a step runs on."""

    samples: int = SAMPLES
    refresh: int = REFRESH
    _times: dict[tuple[int, Graph], deque[float]] = field(default_factory=dict)
    _steps: dict[int, int] = field(default_factory=dict)

    def pick(self, rows: int) -> Graph:
        """The graph a step of `rows` rows runs on: the one with fewer times kept while either has fewer than
        `samples` (the main one first), then the faster (`_faster`), the other once every `refresh` steps."""
        steps = self._steps[rows] = self._steps.get(rows, 0) + 1
        main, templates = self._kept(rows, "main"), self._kept(rows, "templates")
        if len(main) < self.samples or len(templates) < self.samples:
            return "templates" if len(templates) < len(main) else "main"
        faster = _faster(main, templates)
        if steps % self.refresh == 0:
            return "main" if faster == "templates" else "templates"
        return faster

    def record(self, rows: int, graph: Graph, seconds: float) -> None:
        """A step of `rows` rows took `seconds` on `graph`."""
        self._kept(rows, graph).append(seconds)

    def chosen(self) -> dict[int, Graph]:
        """Each row count measured on both graphs, and the faster one (what `pick` runs, refreshes aside)."""
        chosen: dict[int, Graph] = {}
        for rows in sorted(self._steps):
            main, templates = self._kept(rows, "main"), self._kept(rows, "templates")
            if main and templates:
                chosen[rows] = _faster(main, templates)
        return chosen

    def _kept(self, rows: int, graph: Graph) -> deque[float]:
        kept = self._times.get((rows, graph))
        if kept is None:
            kept = self._times[rows, graph] = deque(maxlen=self.samples)
        return kept


def _faster(main: deque[float], templates: deque[float]) -> Graph:
    """The graph whose fastest kept step was faster: the main one on a tie."""
    return "templates" if min(templates) < min(main) else "main"
