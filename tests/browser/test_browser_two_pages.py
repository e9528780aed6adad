"""Two people on one server, in Debian's chromium: two browser contexts (two Streamlit sessions) run at once.

Page A queues the example workload with staggered arrivals (one request every 0.5 s, so its run spans seconds);
page B types three prompts of its own (one with a long answer). Both press Generate back to back. The test then
checks that:

1. the two runs were batched together on the one shared engine: each page's "Everything (JSON)" download holds
   its live run's steps (the engine's own step number and who sat in each slot, the occupancy chart's data);
   at least one engine step held requests of both pages, and where both pages recorded that step, one page's
   own slots are exactly the other page's "other" slots. The page says so too (its caption and the live
   occupancy chart's legend name other users' requests);
2. each page shows only its own answers: its answer cards list exactly its own prompts, in order, and no prompt
   of the other page appears anywhere on it (nor in its download).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from batching.bench.workloads import load_workload
from tests.browser.helpers import BROWSER_MARKS, IDLE, add_prompt, new_page, use_shared_engine
from utils.charts.run import OTHERS  # the occupancy legend's name for other users' requests

pytestmark = BROWSER_MARKS

EXAMPLE_PROMPTS = [request.prompt for request in load_workload("customer-support").requests]  # page A loads it
B_PROMPTS = [  # none of these is in the example; the first gets the embedded model's longest answer
    "Tell me everything the Aurora X12 phone can do.",
    "What can the Orbit smartwatch track?",
    "Do you deliver on Sundays?",
]
OTHERS_CAPTION = "Other people's requests shared the engine during your live run"
CARD_HEADING = re.compile(r"^#(\d+) · (.+)$")


def main(page):
    return page.get_by_test_id("stMain")


def switch_off_comparison(page) -> None:
    """No replays after the run: the page is done sooner and keeps the live occupancy chart (yours vs others')."""
    use_shared_engine(page)
    label = "Compare with static batching afterwards"
    sidebar = page.get_by_test_id("stSidebar")
    sidebar.get_by_text(label, exact=True).click()  # the input itself is hidden under Streamlit's drawn box
    page.wait_for_selector(IDLE)
    assert not sidebar.get_by_role("checkbox", name=label).is_checked()


def card_headings(page) -> list[tuple[int, str]]:
    """(number, prompt) of every answer card, in page order: each card opens with `#n · prompt` (plain text)."""
    texts = main(page).get_by_test_id("stHtml").all_inner_texts()
    return [(int(m[1]), m[2]) for text in texts if (m := CARD_HEADING.match(text.strip()))]


def download_json(page) -> dict:
    with page.expect_download(timeout=30_000) as info:
        main(page).get_by_role("button", name="Everything (JSON)").click()
    return json.loads(Path(info.value.path()).read_text(encoding="utf-8"))


def live_steps(document: dict) -> dict[int, list[str]]:
    """Engine step number -> who sat in each slot (`#n` this page's request, `other`, `-` empty)."""
    return {row["step"]: row["slot_contents"].split(" | ") for row in document["runs"]["live"]["steps"]}


def shared_steps(steps: dict[int, list[str]]) -> list[int]:
    """Steps whose forward pass held this page's requests and other users' requests together."""
    return [step for step, slots in steps.items() if "other" in slots and any(slot.startswith("#") for slot in slots)]


@pytest.mark.long
def test_two_pages_share_one_batch_but_see_only_their_own_answers(app_url, chromium, record_property) -> None:
    assert not set(B_PROMPTS) & set(EXAMPLE_PROMPTS), "the two pages need distinct prompts"
    began = time.perf_counter()
    page_a, page_b = new_page(chromium, app_url), new_page(chromium, app_url)
    for page in (page_a, page_b):
        switch_off_comparison(page)

    # A: the example, one request every 0.5 s (the run lasts several seconds); B: three typed prompts, all at once.
    page_a.get_by_test_id("stSidebar").get_by_text("staggered", exact=True).click()
    page_a.get_by_text("Seconds between requests").wait_for()
    page_a.wait_for_selector(IDLE)
    main(page_a).get_by_role("button", name="Load example").click()
    page_a.get_by_text(f"{len(EXAMPLE_PROMPTS)} of 64 prompts").wait_for()
    page_a.wait_for_selector(IDLE)
    for number, prompt in enumerate(B_PROMPTS, start=1):
        add_prompt(page_b, prompt)
        page_b.get_by_text(f"{number} of 64 prompts").wait_for()
        page_b.wait_for_selector(IDLE)

    # Generate on both, back to back.
    main(page_a).get_by_role("button", name="Generate").click()
    clicked_a = time.perf_counter()
    main(page_b).get_by_role("button", name="Generate").click()
    clicked_b = time.perf_counter()
    record_property("click_gap_s", round(clicked_b - clicked_a, 3))
    for page, prompts in ((page_a, EXAMPLE_PROMPTS), (page_b, B_PROMPTS)):
        done = f"finished · {len(prompts)} of {len(prompts)} done"
        try:
            page.get_by_text(done).wait_for(timeout=90_000)
        except Exception as exc:
            progress = main(page).get_by_text(re.compile(r"(running|stopped|finished) ·")).all_inner_texts()
            raise AssertionError(f"a page never showed {done!r}; its progress line: {progress}") from exc
        page.wait_for_selector(IDLE)

    # 1. One batch: the same engine steps held both pages' requests.
    doc_a, doc_b = download_json(page_a), download_json(page_b)
    steps_a, steps_b = live_steps(doc_a), live_steps(doc_b)
    shared_a, shared_b = shared_steps(steps_a), shared_steps(steps_b)
    record_property("shared_steps", {"A": len(shared_a), "B": len(shared_b)})
    print(
        f"\nclicks {clicked_b - clicked_a:.2f} s apart; steps with both pages' requests: "
        f"{len(shared_a)} of A's {len(steps_a)}, {len(shared_b)} of B's {len(steps_b)}"
    )
    assert shared_a or shared_b, (
        f"no engine step held requests of both pages (A saw steps {min(steps_a, default=None)}.."
        f"{max(steps_a, default=None)}, B saw {min(steps_b, default=None)}..{max(steps_b, default=None)}): "
        "the two runs did not overlap on the shared engine"
    )
    # Where both pages recorded the same engine step, they agree slot by slot: mine on one page is `other` there.
    for step in sorted(set(steps_a) & set(steps_b)):
        for slot, (seen_a, seen_b) in enumerate(zip(steps_a[step], steps_b[step], strict=True)):
            if seen_a.startswith("#"):
                assert seen_b == "other", f"engine step {step}, slot {slot + 1}: A's {seen_a} is {seen_b!r} on B"
            if seen_b.startswith("#"):
                assert seen_a == "other", f"engine step {step}, slot {slot + 1}: B's {seen_b} is {seen_a!r} on A"
    # The page that shared steps says so, in words and in its live occupancy chart's legend.
    for page, shared in ((page_a, shared_a), (page_b, shared_b)):
        if shared:
            assert main(page).get_by_text(OTHERS_CAPTION).count() == 1
            occupancy = main(page).get_by_test_id("stVegaLiteChart").first
            occupancy.get_by_text(OTHERS, exact=True).wait_for(timeout=10_000)

    # 2. Each page shows only its own answers.
    for page, own, theirs, document, name in (
        (page_a, EXAMPLE_PROMPTS, B_PROMPTS, doc_a, "A"),
        (page_b, B_PROMPTS, EXAMPLE_PROMPTS, doc_b, "B"),
    ):
        assert card_headings(page) == list(enumerate(own, start=1)), f"page {name}'s answer cards"
        assert main(page).get_by_test_id("stText").count() == len(own), f"page {name}'s answers"
        texts = main(page).get_by_test_id("stText").all_inner_texts()
        assert sum(1 for text in texts if text.strip()) == len(own), f"page {name} has an empty answer"
        shown = main(page).inner_text()
        leaked = [prompt for prompt in theirs if prompt in shown]
        assert not leaked, f"page {name} shows the other page's prompts: {leaked}"
        requests = document["runs"]["live"]["requests"]
        assert sorted(row["prompt"] for row in requests) == sorted(own), f"page {name}'s downloaded requests"

    elapsed = time.perf_counter() - began
    record_property("test_s", round(elapsed, 1))
    print(f"two-page test body took {elapsed:.1f} s")
