"""Batchscope: watch continuous batching of LLM inference happen, and measure why it beats static batching.

This file is the frame every view sits in: the settings, the engine's client (one process per server, shared by
every tab), the sidebar choices every view shares, and the navigation between the views. Each view is a folder of
`app/` (`race/`, `shared_engine/`, `remote/`, `sweep/`: its page script, its run, its state and its sections), with
what several share in `app/common/`. The engine runs in `batching/`; `app/` draws it; `utils/` turns its events into
frames, charts and files.
"""

from __future__ import annotations

import streamlit as st

from app.common import frame
from app.common.sidebar import shared_choices
from app.race import run as race
from app.remote import run as remote
from app.shared_engine import run as shared_engine
from app.sweep import run as sweep
from batching.service import engine_options
from utils.log_setup import configure_logging

INTRO = (
    "Queue some prompts, press Generate and watch continuous and static batching race on the same queue, live. "
    "Continuous batching gives a slot to a waiting request the moment another finishes; static batching waits "
    "for the whole batch. The charts and the numbers show what that is worth."
)
RACE = frame.View("app/race/page.py", "race", "Race: continuous vs static", race.KEY)
SHARED = frame.View("app/shared_engine/page.py", "shared", "Shared engine (everyone's requests)", shared_engine.KEY)
REMOTE = frame.View("app/remote/page.py", "remote", "Remote server", remote.KEY)
SWEEP = frame.View("app/sweep/page.py", "sweep", "Load sweep", sweep.KEY)
VIEWS = (RACE, SHARED, REMOTE, SWEEP)


def main() -> None:
    configure_logging()
    st.set_page_config(page_title="Batchscope", page_icon="🔭", layout="wide")
    st.title("Batchscope")
    st.caption(INTRO)

    settings = frame.model_choice(frame.settings_or_stop())
    service = frame.model_or_stop(settings)
    builder = service.admission.builder(
        engine_options(settings, settings.batching.max_batch_size, settings.batching.policy)
    )
    st.caption(frame.model_line(service.info, builder))

    opens_on = REMOTE if settings.remote.url else RACE  # a server set in the settings is what the page opens on
    pages = {
        view: st.Page(view.path, title=view.title, url_path=view.url_path, default=view == opens_on) for view in VIEWS
    }
    page = st.navigation(list(pages.values()), position="sidebar")
    shown = next(view for view, each in pages.items() if each is page)
    frame.let_go_of_runs_elsewhere(VIEWS, shown)

    controls = st.sidebar.container()  # the view's own controls go here, above the choices every view shares
    choices = shared_choices(settings)
    options = engine_options(settings, choices.batch_size, choices.policy)
    frame.engine_lines(service, settings)
    frame.keep_queue(settings, builder.max_new_tokens)
    st.session_state[frame.KEY] = frame.Frame(settings, service, builder, choices, options, controls)
    page.run()


if __name__ == "__main__":
    main()
