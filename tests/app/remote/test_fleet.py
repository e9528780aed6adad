"""The remote view pointed at a fleet, in AppTest: two of our servers behind a real router (`vllm-router`, and
`sglang-router`, whose model list says "unknown": the first replica names the model), the queue sent through it,
each replica's batch and KV use drawn side by side from its own /metrics, and how evenly the router spread it."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.app.remote.test_page import _add, _generate, _open, remote_env  # noqa: F401 (a fixture)
from tests.serve.helpers import served, two_eager_servers
from tests.serve.routers import ROUTERS, Router, running_router
from utils.plain_text import escape_markdown


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    with two_eager_servers(tmp_path_factory.mktemp("fleet-view")) as urls:
        yield urls


@pytest.fixture(scope="module", params=sorted(ROUTERS))
def router(request: pytest.FixtureRequest, servers: tuple[str, str], tmp_path_factory) -> Iterator[Router]:
    with running_router(request.param, servers, tmp_path_factory.mktemp(request.param)) as running:
        yield running


def _titles(at) -> list[str]:
    return [str(json.loads(element.proto.spec).get("title")) for element in at.get("vega_lite_chart")]


@pytest.mark.long
def test_the_queue_through_a_router_draws_each_replica_side_by_side_and_the_spread(
    remote_env: pytest.MonkeyPatch,  # noqa: F811
    servers: tuple[str, str],
    router: Router,
) -> None:
    remote_env.setenv("BATCHSCOPE_REMOTE__URL", router.url)
    at = _open()
    at.checkbox(key="remote_fleet").check().run()
    names = [url.removeprefix("http://") for url in servers]
    captions = [c.value for c in at.sidebar.caption]
    assert "Watching model **builtin** at " + escape_markdown(router.url) in captions
    shown = [escape_markdown(name) for name in names]
    assert any(c.startswith("Through the router to 2 replicas: ") and all(n in c for n in shown) for c in captions)
    at.checkbox(key="compare").uncheck().run()
    before = [served(url)[0] for url in servers]
    for prompt in ("How do I track my order?", "Do you ship abroad?", "Can I pay by bank transfer?", "Hello?"):
        _add(at, prompt, 6)
    _generate(at)
    kept = at.session_state.remote_run
    assert kept.run.done and [view.status for view in kept.run.views] == ["done"] * 4
    assert set(kept.fleet) == set(names) and kept.setup["replicas"] == [f"http://{n}" for n in kept.fleet]
    assert not any(poller.running for poller in kept.fleet.values())  # no reading after the run
    assert "4 · The fleet's replicas" in [h.value for h in at.header]
    replicas = [m.value for m in at.markdown if m.value.startswith("**127")]
    assert replicas == [f"**{escape_markdown(name)}**" for name in kept.fleet]
    titles = _titles(at)
    assert titles.count("Requests running and waiting") == 2 and titles.count("KV-cache use") == 2
    lines = [c.value for c in at.main.caption if c.value.startswith("Server telemetry (Batchscope, ")]
    assert len(lines) >= 2 and all("KV-cache use: peak " in line for line in lines)
    answered = [served(url)[0] - count for url, count in zip(servers, before, strict=True)]
    assert sum(answered) == 4 + 1 and min(answered) >= 2  # the queue and the warm-up, round robin over both
    (spread,) = [c.value for c in at.main.caption if c.value.startswith("How evenly the router spread")]
    for name in names:  # round robin: the queue's four requests two and two (the warm-up came before the readings)
        assert escape_markdown(f"{name} 2 (50%)") in spread, spread
