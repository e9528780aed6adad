"""Which of a model's two decode graphs a step takes (`graph_choice`): each row count's first steps alternate, then
the graph whose fastest recent step was faster runs them, the other now and then. Times are given, not measured."""

from __future__ import annotations

from batching.engine.graph_choice import GraphChoice


def _run(choice: GraphChoice, rows: int, steps: int, seconds: dict[str, float]) -> list[str]:
    """`steps` steps of `rows` rows, each taking its graph's `seconds`; the graphs picked, in order."""
    picked = []
    for _ in range(steps):
        graph = choice.pick(rows)
        choice.record(rows, graph, seconds[graph])
        picked.append(graph)
    return picked


def test_a_row_counts_first_steps_alternate_then_the_faster_graph_runs_them_and_the_other_now_and_then() -> None:
    choice = GraphChoice(samples=3, refresh=8)
    picked = _run(choice, rows=2, steps=16, seconds={"main": 0.050, "templates": 0.030})
    assert picked[:6] == ["main", "templates"] * 3
    assert picked[6:] == ["templates", "main"] + ["templates"] * 7 + ["main"]  # steps 8 and 16: the other
    assert choice.chosen() == {2: "templates"}


def test_each_row_count_is_timed_on_its_own_and_a_tie_keeps_the_main_graph() -> None:
    choice = GraphChoice(samples=2, refresh=100)
    assert _run(choice, rows=8, steps=6, seconds={"main": 0.060, "templates": 0.080})[4:] == ["main", "main"]
    assert _run(choice, rows=1, steps=6, seconds={"main": 0.050, "templates": 0.040})[4:] == ["templates"] * 2
    assert _run(choice, rows=3, steps=6, seconds={"main": 0.040, "templates": 0.040})[4:] == ["main", "main"]
    assert choice.chosen() == {1: "templates", 3: "main", 8: "main"}


def test_a_choice_follows_the_machine_its_fastest_recent_step_not_one_slow_step() -> None:
    choice = GraphChoice(samples=3, refresh=4)
    _run(choice, rows=4, steps=6, seconds={"main": 0.040, "templates": 0.030})
    choice.record(4, "templates", 0.500)  # one step the machine slowed: the fastest kept one still counts
    assert choice.chosen() == {4: "templates"}
    # The templates' steps turn slower (another process on the core, say): once the fast ones are out of the kept
    # steps the choice moves, and the templates' graph runs only the refreshes (every 4th step of the row count).
    picked = _run(choice, rows=4, steps=12, seconds={"main": 0.040, "templates": 0.070})
    assert picked == ["templates", "main", "templates"] + ["main", "main", "templates", "main"] * 2 + ["main"]
    assert choice.chosen() == {4: "main"}
