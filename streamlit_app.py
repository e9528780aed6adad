"""Batchscope: watch continuous batching of LLM inference happen, and measure why it beats static batching.

The page only draws. The engine (`batching/`) runs in a process of its own, shared by every browser tab through
one client; `utils/` turns its events into the queue view, frames, charts and files, and
`app/streaming.py` holds the body of the streaming loop. `main()` reads top to bottom as the page does.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace

import pandas as pd
import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from app.live_run import REPLAY_ORDER, LiveRun, RequestView
from app.prompt_queue import Check, PromptQueue, QueueError, has_edits
from app.race_view import LANE_NAMES, RaceRun
from app.streaming import RaceStream, Stream, join_new_items
from batching.arrivals import Schedule
from batching.bench.workloads import builtin_workload_names, load_workload
from batching.engine.batcher import BatcherOptions
from batching.engine.builder import RequestBuilder
from batching.engine.compiled import CompileState
from batching.engine.events import FinishedEvent, StepEvent
from batching.engine.model_support import UnsupportedModelError
from batching.engine.params import RequestParams, SamplingParams
from batching.remote import (
    APIS,
    MODES,
    SAMPLE_EVERY_S,
    WARM_UP_QUESTION,
    Api,
    Endpoint,
    Mode,
    RemoteError,
    RemoteRun,
    RunSetup,
    endpoint_from_settings,
    fetch_model,
    warm_up,
)
from batching.serve.server import BackgroundServer, start_background
from batching.service import EngineClient, EngineConfig, RaceHandle, Session, engine_options
from config.settings import (
    EngineSettings,
    LimitSettings,
    ModelSettings,
    Settings,
    SettingsError,
    TokenizerSettings,
    load_settings,
    setting_warnings,
)
from model.loader import ModelLoadError
from model.prompting import format_prompt
from utils import charts, export
from utils.charts import Owns
from utils.inspector import WasteMeters, grid_frame, packed_tokens, step_rows_frame, waste_meters
from utils.inspector_charts import GRID_CAPTION, MASK_CAPTION, mask_chart, packed_sequence_html, token_grid_chart
from utils.inspector_mask import mask_frame, padded_rectangle, window_name
from utils.log_setup import configure_logging
from utils.metrics import RunRecord, steps_kind, summarize
from utils.plain_text import card_heading_html, escape_markdown
from utils.telemetry_charts import CAPTION as TELEMETRY_CAPTION
from utils.telemetry_charts import reported_line, telemetry_chart, telemetry_frame, telemetry_table

DEFAULT_EXAMPLE = "customer-support"
INTRO = (
    "Queue some prompts, press Generate and watch continuous and static batching race on the same queue, live. "
    "Continuous batching gives a slot to a waiting request the moment another finishes; static batching waits "
    "for the whole batch. The charts and the numbers show what that is worth."
)
RUN_MODES = {
    "race": "Race: continuous vs static, live (private, fair clocks)",
    "shared": "Shared engine (everyone's requests)",
}
RACE_NOTES = (
    "Continuous lane: a finished request frees its slot and a waiting one joins on the next step.",
    "Static lane: waves of the batch size; each wave waits for its longest member.",
)
RACE_CLOCKS = (
    "Both lanes ran the same prompts, caps, sampling and arrival times in the engine process, which steps them in "
    "turn, always the lane that is behind, so they never compete for the CPU. Each lane's clock counts only its "
    "own steps (and jumps over idle gaps to the next arrival), so the speed-up is the ratio of the two clocks; "
    "slow-motion pauses are on neither clock."
)
CONTINUOUS_LIVE = "Live: your run on the shared engine, drawn as it happens."
CONTINUOUS_REPLAYED = "Your queue replayed on a private continuous batcher, measured the same way as static batching."
STATIC_LATER = "The same queue on a private static batcher (fixed waves), measured after your run."
ARRIVALS = ("all at once", "staggered", "Poisson")
SEED_NOTE = (
    "Request #n samples with seed + n − 1: identical prompts get different answers, and the same queue gets the same "
    "answers run after run. The seed also draws Poisson arrivals."
)
POLICY_NAMES = {
    "fcfs": "first come, first served",
    "shortest-first": "shortest cap first",
    "longest-first": "longest cap first",
}
CHARTS = ("occupancy", "latency", "timeline")
RUN_NAMES = {"continuous": "continuous (replay)", "static": "static (replay)", "live": "live (shared engine)"}
LANE_RUN_NAMES = {"continuous": "continuous (race lane)", "static": "static (race lane)"}
Decode = Callable[[Sequence[int]], str]


# --- resources shared by every tab of this process ---------------------------------------------------------
@st.cache_resource(show_spinner=False)
def get_service(model_json: str, tokenizer_json: str, engine_json: str, limits_json: str) -> EngineClient:
    """The engine process of this server (it loads the model once), shared by every tab through one client."""
    config = EngineConfig(
        ModelSettings.model_validate_json(model_json),
        TokenizerSettings.model_validate_json(tokenizer_json),
        EngineSettings.model_validate_json(engine_json),
    )
    return EngineClient(config, LimitSettings.model_validate_json(limits_json))


# --- what one script run works with --------------------------------------------------------------------------
@dataclass(frozen=True)
class Choices:
    """What the person chose in the sidebar."""

    batch_size: int
    policy: str
    sampling: SamplingParams
    system_prompt: str
    arrivals: str
    interval: float
    rate: float
    compare: bool
    run_mode: str = "race"
    pause_ms: int = 0

    def schedule(self, count: int) -> Schedule:
        """When each of `count` prompts joins, in seconds after Generate."""
        if self.arrivals == "staggered":
            return Schedule.timed([i * self.interval for i in range(count)], f"one request every {self.interval:g} s")
        if self.arrivals == "Poisson":
            return Schedule.poisson(count, self.rate, self.sampling.seed)
        return Schedule.at_once(count)


@dataclass(frozen=True)
class Page:
    """The settings, model, choices and shared engine of this script run: what sections and callbacks are given."""

    settings: Settings
    service: EngineClient
    builder: RequestBuilder
    choices: Choices
    options: BatcherOptions
    remote: RemoteChoice | None = None  # a remote server to run the queue on instead of the built-in engine

    def formatted(self, prompt: str) -> str:
        if self.remote is not None and self.remote.api == "chat":  # the server applies its own chat template
            return prompt
        return format_prompt(prompt, self.choices.system_prompt, self.settings.prompt.template)

    def check_prompt(self, prompt: str, cap: int) -> None:
        """Would the engine accept this prompt (with the system prompt around it) and this cap? ValueError if not."""
        self.builder.build(self.formatted(prompt), RequestParams(cap))


@dataclass(frozen=True)
class ChartLayout:
    """The placeholders of section 3: a progress bar for the replays, column notes, and each chart's two sides."""

    replay: DeltaGenerator
    notes: tuple[DeltaGenerator, DeltaGenerator]
    slots: dict[str, tuple[DeltaGenerator, DeltaGenerator]]


# --- settings, model, sidebar ----------------------------------------------------------------------------------
def settings_or_stop() -> Settings:
    """The settings; misspelt names are warned about first (they may be why a value is not what was meant)."""
    for line in setting_warnings():
        st.warning(escape_markdown(line))
    try:
        return load_settings()
    except SettingsError as exc:
        st.error(f"A setting is not valid: {exc}")
        st.info("Fix that environment variable (or the line in `.env`) and reload the page.")
        st.stop()


def model_or_stop(settings: Settings) -> EngineClient:
    """The engine process with the model loaded (started by the first page load of this server)."""
    try:
        with st.spinner(f"Loading the model `{settings.model.name_or_path}` (once per server)…"):
            return get_service(
                settings.model.model_dump_json(),
                settings.tokenizer.model_dump_json(),
                settings.engine.model_dump_json(),
                settings.limits.model_dump_json(),
            )
    except UnsupportedModelError as exc:  # loaded, but the engine cannot run it exactly: one line, nothing else
        st.error(str(exc))
        st.stop()
    except ModelLoadError as exc:
        st.error(f"The model could not be loaded: {exc}")
        st.info("Change that setting (environment variable or `.env`) and restart the app.")
        st.stop()
    except Exception as exc:  # a broken model folder can fail in many ways; the page still explains, not a traceback
        st.error(
            f"The model could not be loaded ({type(exc).__name__}: {str(exc)[:200]}); "
            "check BATCHSCOPE_MODEL__NAME_OR_PATH and the model files."
        )
        st.stop()


def sidebar(settings: Settings, remote: bool = False) -> Choices:
    """How the engine runs: race or shared, slots, policy, sampling, system prompt, arrivals, comparison (a remote
    server runs the queue continuously, then in static waves: no race there)."""
    gen = settings.generation
    with st.sidebar:
        st.header("Run")
        if remote:
            st.caption(
                "On a remote server: continuous (up to N requests in flight) and static waves of N, after one "
                "warm-up request; which runs first alternates with each comparison."
            )
        run_mode: str = (
            "remote"
            if remote
            else st.radio(
                "Run the queue as",
                list(RUN_MODES),
                format_func=RUN_MODES.__getitem__,
                key="run_mode",
                help="The race runs your queue on a continuous and a static batcher of your own, side by side. The "
                "shared engine batches your prompts with everyone else's, then replays them to compare.",
            )
        )
        race = run_mode == "race"
        pause_ms = (
            st.slider(
                "Slow motion (pause between steps, ms)",
                0,
                300,
                0,
                10,
                key="slow_motion",
                help="Follow the slots step by step. The pause is counted on neither lane's clock.",
            )
            if race
            else 0
        )
        st.header("Engine")
        batch_size = st.slider(
            "Batch size (slots)",
            1,
            max(16, settings.batching.max_batch_size),
            settings.batching.max_batch_size,
            help="How many requests are decoded together in one forward pass.",
            key="batch_size",
        )
        policies = list(POLICY_NAMES)
        policy: str = st.selectbox(
            "Scheduling policy",
            policies,
            index=policies.index(settings.batching.policy),
            format_func=POLICY_NAMES.__getitem__,
            help="Which waiting request gets the next free slot.",
            key="policy",
        )
        st.header("Sampling")
        decoding = st.radio("Decoding", ["greedy", "sample"], index=int(gen.do_sample), horizontal=True, key="decoding")
        sample = decoding == "sample"
        temperature, top_k, top_p = gen.temperature, gen.top_k, gen.top_p
        if sample:
            temperature = st.slider("Temperature", 0.05, 2.0, min(max(gen.temperature, 0.05), 2.0), 0.05)
            top_k = st.number_input("Top-k (0 keeps every token)", 0, 1000, min(gen.top_k, 1000))
            top_p = st.slider("Top-p", 0.05, 1.0, max(gen.top_p, 0.05), 0.05)
        repetition_penalty = st.number_input("Repetition penalty", 0.5, 3.0, min(max(gen.repetition_penalty, 0.5), 3.0))
        seed = st.number_input("Seed", 0, 2**31 - 1, gen.seed)
        st.caption(SEED_NOTE)
        st.header("Prompt")
        system_prompt = st.text_area("System prompt", settings.prompt.system_prompt, height=100)
        st.header("Arrivals")
        arrivals = st.radio(
            "How requests join",
            ARRIVALS,
            help="Staggered and Poisson arrivals make requests join a batch that is already running.",
            key="arrivals",
        )
        interval = (
            st.slider("Seconds between requests", 0.1, 3.0, 0.5, 0.1, key="interval")
            if arrivals == "staggered"
            else 0.5
        )
        rate = st.slider("Requests per second", 0.5, 20.0, 4.0, 0.5, key="rate") if arrivals == "Poisson" else 2.0
        compare = (
            st.checkbox("Compare with static batching afterwards", value=True, key="compare") if not race else True
        )
    return Choices(
        batch_size=batch_size,
        policy=policy,
        sampling=SamplingParams(sample, temperature, int(top_k), top_p, repetition_penalty, int(seed)),
        system_prompt=system_prompt,
        arrivals=arrivals,
        interval=interval,
        rate=rate,
        compare=compare,
        run_mode=run_mode,
        pause_ms=int(pause_ms),
    )


def shared_engine(service: EngineClient, settings: Settings) -> None:
    """Restart the engine process (with a warning) if it had died; say how many batchers are live, and where the
    OpenAI-compatible API of this server listens when `BATCHSCOPE_SERVER__PORT` is set."""
    if service.ensure_running():
        st.warning(
            f"The shared engine had stopped ({service.last_error}); it was restarted (restart {service.restarts})."
        )
    st.sidebar.caption(f"Engines live on this server: {service.live_engines} (at most {settings.engine.max_engines})")
    st.sidebar.caption(compile_caption(service.compile_state))
    port = settings.server.port
    if port is not None:
        get_api(service, settings.model_dump_json(), port)
        st.sidebar.caption(f"OpenAI-compatible API: http://{settings.server.host}:{port}/v1 (same engine as this page)")


def compile_caption(state: CompileState) -> str:
    """One line on the decode steps: eager, being compiled in the background, or compiled."""
    if state.stage == "compiled":
        return f"Decode steps: compiled (the graph took {state.seconds:.0f} s to make, once per batch size)."
    return {
        "off": "Decode steps: eager (compiling is off: BATCHSCOPE_ENGINE__COMPILE_STEPS=false).",
        "waiting": "Decode steps: eager; the first run starts compiling them in the background.",
        "compiling": "Decode steps: eager while their graph is compiled in the background, only while the engine "
        "is idle (the compile pauses while anything runs, so it never slows a run or its figures).",
        "failed": "Decode steps: eager; they could not be compiled here (the engine's log says why).",
    }[state.stage]


@st.cache_resource(show_spinner=False)
def get_api(_service: EngineClient, settings_json: str, port: int) -> BackgroundServer:
    """The API inside this process, once per server: its requests and the tabs' share the engine's batches."""
    return start_background(_service, Settings.model_validate_json(settings_json), port)


# --- session state: the canonical queue, the run, this tab's engine sessions ----------------------------------
def init_state(settings: Settings, max_cap: int) -> None:
    state = st.session_state
    if "queue" not in state:
        state.queue = PromptQueue(settings.limits.max_queue_per_session, max_cap)
        state.queue_message = None
        state.editor_version = 0
        state.run = None
        state.engine_sessions = {}


def engine_session(service: EngineClient, options: BatcherOptions) -> Session:
    """This tab's handle on the shared batcher for `options` (one per batcher, reopened if it was reaped)."""
    sessions = st.session_state.engine_sessions
    session = sessions.get(options)
    if session is None or session.closed:
        session = sessions[options] = service.open_session(options)
    return session


# --- callbacks (run before the next script run, with the arguments given when their widget was drawn) ----------
def on_add(queue: PromptQueue, check: Check) -> None:
    state = st.session_state
    try:
        queue.add(state.new_prompt, state.new_cap, check)
    except QueueError as exc:
        state.queue_message = str(exc)
        return
    state.queue_message = None
    state.new_prompt = ""


def on_load_example(queue: PromptQueue, check: Check, default_cap: int) -> None:
    state = st.session_state
    workload = load_workload(state.example)
    pairs = [(r.prompt, r.max_new_tokens or default_cap) for r in workload.requests]
    try:
        queue.replace_all(pairs, check)
    except QueueError as exc:
        state.queue_message = f"{state.example}: {exc}"
        return
    state.queue_message = None
    state.editor_version += 1


def on_clear(queue: PromptQueue) -> None:
    queue.clear()
    st.session_state.queue_message = None
    st.session_state.editor_version += 1


def on_stop() -> None:
    state = st.session_state
    if isinstance(state.run, RaceRun):
        state.run.stop()
        state.race_handle.stop()
    elif state.run is not None:
        state.run.stop()
        state.run_session.cancel_all()


def start_run(page: Page, queue: PromptQueue) -> None:
    """Plan every queued prompt with its arrival time; the streaming loop submits them when due."""
    state = st.session_state
    if page.remote is not None and len(queue):
        start_remote_run(page, queue)
        return
    if not len(queue):
        state.queue_message = "the queue is empty: add a prompt or load an example first"
        return
    choices = page.choices
    if choices.run_mode == "race":
        start_race(page, queue)
        return
    session = engine_session(page.service, page.options)
    started = LiveRun(time.perf_counter(), session.session_id + "/", choices.batch_size, choices.sampling)
    schedule = choices.schedule(len(queue))
    for item, offset in zip(queue.items, schedule.due, strict=True):
        started.plan(item.prompt, page.formatted(item.prompt), item.max_new_tokens, offset)
    state.run, state.run_session, state.run_items = started, session, {item.item_id for item in queue.items}
    state.run_setup = run_setup(page, schedule)
    state.queue_message = None


def run_setup(page: Page, schedule: Schedule) -> dict:
    """What a run was asked to do, for the export."""
    choices = page.choices
    return {
        "model": page.service.info.name,
        "run": choices.run_mode,
        "engine": asdict(page.options),
        "sampling": asdict(choices.sampling),
        "arrivals": schedule.description,
        "system_prompt": choices.system_prompt,
        "compare": choices.compare,
        "slow_motion_ms": choices.pause_ms,
    }


def start_race(page: Page, queue: PromptQueue) -> None:
    """Start the queue racing on a continuous and a static lane of this tab's own, in the engine process."""
    state = st.session_state
    choices = page.choices
    schedule = choices.schedule(len(queue))
    race = RaceRun(f"t{id(state)}/", choices.batch_size, choices.sampling)
    for item, offset in zip(queue.items, schedule.due, strict=True):
        race.plan(item.prompt, page.formatted(item.prompt), item.max_new_tokens, offset)
    try:
        handle = page.service.start_race(page.options, race.items(), schedule, choices.pause_ms / 1000)
    except ValueError as exc:
        state.queue_message = str(exc)
        return
    state.run, state.race_handle, state.run_items = race, handle, {item.item_id for item in queue.items}
    state.race_pause_ms = choices.pause_ms
    state.run_setup = run_setup(page, schedule)
    state.queue_message = None


def follow_race_choices(page: Page, race: RaceRun, queue: PromptQueue) -> None:
    """During a race: prompts added since join both lanes at the same clock time; a new slow motion applies now."""
    state = st.session_state
    handle = state.race_handle
    offset = max(race.elapsed.values())
    for item in queue.items:
        if item.item_id in state.run_items:
            continue
        state.run_items.add(item.item_id)
        request_id = race.plan(item.prompt, page.formatted(item.prompt), item.max_new_tokens, offset)
        try:
            handle.add(page.formatted(item.prompt), race.params(request_id), request_id)
        except ValueError as exc:
            for lane in race.lanes.values():
                lane.refuse(lane.views[-1], str(exc))
    if state.race_pause_ms != page.choices.pause_ms:
        state.race_pause_ms = page.choices.pause_ms
        handle.set_pause(page.choices.pause_ms / 1000)


# --- 1. the queue ------------------------------------------------------------------------------------------------
def queue_section(page: Page) -> RunButtons:
    """Add, load, edit and delete prompts; Generate and Stop, returned (they say whether a run was going on)."""
    state = st.session_state
    queue: PromptQueue = state.queue
    default_cap = page.settings.generation.max_new_tokens
    max_cap = page.builder.max_new_tokens
    st.header("1 · Queue your prompts")
    add_col, example_col = st.columns([3, 2], gap="large")
    with add_col:
        st.text_input("Prompt", key="new_prompt", placeholder="e.g. How do I track my order?")
        cap_col, button_col = st.columns([2, 1], vertical_alignment="bottom")
        # Text, not a number box: a number box turns 2.5 into 2 and 1e3 into 1; the queue refuses them as typed.
        cap_col.text_input(
            "Max new tokens", value=str(default_cap), key="new_cap", help=f"A whole number from 1 to {max_cap}."
        )
        button_col.button("Add", on_click=on_add, args=(queue, page.check_prompt), type="primary", width="stretch")
    with example_col:
        examples = builtin_workload_names()
        st.selectbox("Example workload", examples, index=examples.index(DEFAULT_EXAMPLE), key="example")
        load_col, clear_col = st.columns(2)
        load_col.button(
            "Load example",
            on_click=on_load_example,
            args=(queue, page.check_prompt, default_cap),
            width="stretch",
            help="Replaces the queue.",
        )
        clear_col.button("Clear all", on_click=on_clear, args=(queue,), width="stretch")

    # Edits made in the table last time go into the canonical queue, then the table is drawn afresh from it.
    editor_key = f"queue_editor_{state.editor_version}"
    if has_edits(state.get(editor_key)):
        problems = queue.apply_edits(state[editor_key], page.check_prompt)
        state.queue_message = "; ".join(problems) or None
        state.editor_version += 1
        editor_key = f"queue_editor_{state.editor_version}"

    if state.queue_message:
        st.error(state.queue_message)
    st.data_editor(
        queue.editor_frame(),
        key=editor_key,
        num_rows="delete",
        hide_index=False,
        disabled=["prompt"],
        width="stretch",
        column_config={
            "prompt": st.column_config.TextColumn("prompt", width="large"),
            "max_new_tokens": st.column_config.TextColumn(  # text, so bad input is refused as typed
                "max new tokens", help=f"Edit to change this prompt's cap: a whole number from 1 to {max_cap}."
            ),
        },
    )
    st.caption(
        f"{len(queue)} of {queue.max_items} prompts · edit a cap in the table, select rows and delete to remove them"
    )

    run: LiveRun | RaceRun | None = state.run
    running = run is not None and not run.done
    buttons = RunButtons(st.empty(), page, queue, running)
    buttons.draw(running)
    if isinstance(run, RaceRun) and running:
        follow_race_choices(page, run, queue)
    elif isinstance(run, LiveRun) and running:  # prompts added mid-run join it at once: the engine keeps going
        join_new_items(run, queue.items, state.run_items, page.formatted, time.perf_counter())
    return buttons


@dataclass
class RunButtons:
    """Generate and Stop, in a placeholder of their own, so a run that ends during a script run can put Generate
    back in place and the page go on to its numbers (a rerun cost the page a second redraw: about 0.6 s here)."""

    slot: DeltaGenerator
    page: Page
    queue: PromptQueue
    running: bool  # a run was going on when the script run began

    def draw(self, running: bool, key_suffix: str = "") -> None:
        with self.slot.container():
            go_col, stop_col, _ = st.columns([1, 1, 4])
            go_col.button(
                "Generate",
                key=f"generate{key_suffix}",
                on_click=start_run,
                args=(self.page, self.queue),
                type="primary",
                disabled=running,
                width="stretch",
            )
            stop_col.button("Stop", key=f"stop{key_suffix}", on_click=on_stop, disabled=not running, width="stretch")

    def run_ended(self) -> None:
        """The run this script run followed has ended: Generate is back (under other keys: a key is drawn once)."""
        if self.running:
            self.draw(False, key_suffix="-after-run")


# --- 2. answers, streaming -------------------------------------------------------------------------------------
AnswerSlots = tuple[DeltaGenerator, DeltaGenerator]


def draw_answer(view: RequestView, slots: AnswerSlots) -> None:
    """A prompt's status line and its answer so far, as plain text (never markdown or HTML)."""
    status_slot, text_slot = slots
    status_slot.caption(view.status_line())
    text_slot.text(view.shown_text())


def answers_section(run: LiveRun) -> tuple[DeltaGenerator, list[AnswerSlots]]:
    """One card per prompt (its heading, status and answer); returns the progress line's and the cards' slots."""
    st.header("2 · Answers")
    progress_slot = st.empty()
    answer_slots: list[AnswerSlots] = []
    for index, view in enumerate(run.views):
        if index % 2 == 0:
            row = st.columns(2)
        with row[index % 2].container(border=True):
            st.html(card_heading_html(view.number, view.prompt))  # the prompt as plain text, never markdown
            answer_slots.append((st.empty(), st.empty()))
            draw_answer(view, answer_slots[-1])
    return progress_slot, answer_slots


LaneSlots = dict[str, AnswerSlots]


def race_answers_section(race: RaceRun) -> tuple[DeltaGenerator, list[LaneSlots]]:
    """One card per prompt with its answer on each lane side by side; returns the progress line's and cards' slots."""
    st.header("2 · Answers, racing")
    progress_slot = st.empty()
    progress_slot.markdown(race.progress_line())
    answer_slots: list[LaneSlots] = []
    for index, view in enumerate(race.views):
        if index % 2 == 0:
            row = st.columns(2)
        with row[index % 2].container(border=True):
            st.html(card_heading_html(view.number, view.prompt))
            lanes = dict(zip(race.lanes, st.columns(2), strict=True))
            answer_slots.append({})
            for mode, column in lanes.items():
                column.caption(f"**{LANE_NAMES[mode]}**")
                answer_slots[-1][mode] = (column.empty(), column.empty())
                draw_answer(race.lanes[mode].views[index], answer_slots[-1][mode])
    return progress_slot, answer_slots


# --- 3. charts -------------------------------------------------------------------------------------------------
def charts_section(notes_text: tuple[str, str] = (CONTINUOUS_LIVE, STATIC_LATER)) -> ChartLayout:
    """Continuous and static side by side, one row per chart so the two sides line up; drawn into later."""
    st.header("3 · What the engine did")
    replay_slot = st.empty()
    left, right = st.columns(2, gap="large")
    left.subheader("Continuous batching")
    right.subheader("Static batching (same queue)")
    notes = (left.empty(), right.empty())
    notes[0].caption(notes_text[0])
    notes[1].caption(notes_text[1])
    slots = {}
    for name in CHARTS:
        left, right = st.columns(2, gap="large")
        slots[name] = (left.empty(), right.empty())
        left.caption(charts.CAPTIONS[name])
        right.caption(charts.CAPTIONS["occupancy_static" if name == "occupancy" else name])
    return ChartLayout(replay_slot, notes, slots)


def draw_charts(
    layout: ChartLayout,
    run: LiveRun | RaceRun,
    record: RunRecord,
    column: int,
    latency: pd.DataFrame,
    owns: Owns | None,
    x_max: dict | None = None,
) -> None:
    """One run's three charts into its column (0 continuous, 1 static); `x_max` shares axes between the two."""
    x_max = x_max or {}
    occupancy = charts.occupancy_chart(charts.occupancy_frame(record, owns), run.slots, x_max=x_max.get("steps"))
    timeline = charts.timeline_frame(record, run.labels(), owns)
    layout.slots["occupancy"][column].altair_chart(occupancy, width="stretch")
    layout.slots["latency"][column].altair_chart(
        charts.latency_chart(charts.latency_bars_frame(latency), x_max=x_max.get("seconds")), width="stretch"
    )
    layout.slots["timeline"][column].altair_chart(
        charts.timeline_chart(timeline, run.slots, x_max=x_max.get("seconds")), width="stretch"
    )


def stream(
    run: LiveRun,
    session: Session,
    compare: bool,
    progress_slot: DeltaGenerator,
    answer_slots: list[AnswerSlots],
    layout: ChartLayout,
) -> None:
    """Submit prompts as they come due, fold the engine's events in, redraw what changed, until the run is done.

    A click elsewhere stops this script run at its next redraw; the next run picks the same LiveRun up again.
    """
    streaming = Stream(run, session, compare)
    while True:
        redraw = streaming.tick()
        for index, view in redraw.answers:
            draw_answer(view, answer_slots[index])
        if redraw.progress:
            progress_slot.markdown(run.progress_line(redraw.now))
            if redraw.live_charts:
                draw_charts(layout, run, run.record, 0, run.latency_frame(redraw.now), run.owns)
            streaming.charts_drawn(redraw.now)
        if redraw.done:
            return
        time.sleep(streaming.pause())


# The live run shared its CPU with the page drawing it (and maybe with other users), so its timings are not a fair
# match for a static run; the headline compares two replays that only differ in how they batch. They run right after
# the live run, before the page is redrawn, so the browser is quiet while they are timed.
def replay_all(page: Page, run: LiveRun, engine: dict, slot: DeltaGenerator) -> None:
    """Replay the queue in REPLAY_ORDER (resuming where an interrupted script run left off), with a progress bar."""
    total = len(REPLAY_ORDER) * len(run.views)
    while (mode := run.next_replay) is not None:
        done = run.replayed * len(run.views)
        text = f"Measuring: replay {run.replayed + 1} of {len(REPLAY_ORDER)}, {mode} batching"
        bar = slot.progress(done / total, text=text)
        with page.service.open_private(mode, BatcherOptions(**engine)) as batcher:  # stepped in the engine process
            replay = batcher.run(*run.replay_queue())
            for event in replay.events():
                if isinstance(event, FinishedEvent):
                    done += 1
                    bar.progress(done / total, text=text)
        run.keep_replay(replay.record)
    slot.empty()


def comparison_charts(run: LiveRun, compare: bool, layout: ChartLayout) -> dict[str, RunRecord]:
    """Draw the replays side by side (or say why there are none); returns every run to report, by name."""
    runs = {"live": run.record}
    if not compare:
        layout.slots["occupancy"][1].info("The comparison is switched off (sidebar).")
    elif not run.completed:
        layout.slots["occupancy"][1].info("No comparison: the run was stopped or some prompts did not finish.")
    else:
        runs = {"continuous": run.replays["continuous"], "static": run.replays["static"], "live": run.record}
        shared = {
            "seconds": max(runs[mode].wall_s for mode in ("continuous", "static")),
            "steps": max(len(runs[mode].steps) for mode in ("continuous", "static")),
        }
        layout.notes[0].caption(CONTINUOUS_REPLAYED)
        labels = run.labels()
        for column, mode in enumerate(("continuous", "static")):
            draw_charts(layout, run, runs[mode], column, charts.latency_frame(runs[mode], labels), None, shared)
    return runs


def race_stream(
    race: RaceRun, handle: RaceHandle, progress_slot: DeltaGenerator, answer_slots: list[LaneSlots], layout: ChartLayout
) -> None:
    """Fold both lanes' steps in as they come and redraw what changed, until the engine says the race is over."""
    streaming = RaceStream(race, handle)
    while True:
        redraw = streaming.tick()
        for mode, index, view in redraw.answers:
            draw_answer(view, answer_slots[index][mode])
        if redraw.answers or redraw.charts:  # one cheap line: kept in step with the answers
            progress_slot.markdown(race.progress_line())
        if redraw.charts:
            race_charts(race, layout)
            streaming.charts_drawn(redraw.now)
        if redraw.done:
            return
        time.sleep(streaming.pause())


def race_charts(race: RaceRun, layout: ChartLayout) -> None:
    """Both lanes' charts on shared axes (seconds on the lanes' clocks), as far as each has got."""
    runs = race.runs()
    shared = {"seconds": max(race.elapsed.values()) or None, "steps": max(len(r.steps) for r in runs.values()) or None}
    for column, mode in enumerate(runs):
        draw_charts(layout, race, runs[mode], column, race.latency_frame(mode), None, shared)


# --- 4. inside the steps -------------------------------------------------------------------------------------------
def inspector_section(
    runs: dict[str, RunRecord],
    meters: dict[str, WasteMeters],
    labels: dict[str, str],
    decode: Decode,
    names: dict[str, str] = RUN_NAMES,
) -> None:
    """The token grid of one run, its waste meters, and one step looked at closely (picked on the grid or slider)."""
    st.header("4 · Inside the steps")
    modes = [name for name in ("continuous", "static", "live") if name in runs]
    mode = st.radio("Run", modes, horizontal=True, key="inspect_run", format_func=names.get)
    record = runs[mode]
    if not any(step.rows for step in record.steps):
        st.info("This run has no step detail to show.")
        return
    waste = meters[mode]
    columns = st.columns(5)
    columns[0].metric("slot-steps doing work", f"{waste.slot_use:.0%}", help="of slots × steps")
    columns[1].metric("held by finished requests", waste.slot_steps_held, help="slot-steps (static waves)")
    columns[2].metric("padding tokens computed", waste.padding_tokens)
    columns[3].metric("tokens per step", f"{waste.tokens_per_step_mean:.1f}", help="prompt + decode, mean")
    columns[4].metric("token budget filled", f"{waste.budget_fill_mean:.1%}", help="mean over steps")
    frame, width = grid_frame(record, labels)
    if width > 1:
        st.caption(f"{len(record.steps)} steps: each column shows {width} steps (the kind a slot had most often).")
    event = st.altair_chart(
        token_grid_chart(frame, record.slots, width), on_select="rerun", key=f"grid_{mode}", width="stretch"
    )
    st.caption(GRID_CAPTION)
    step_key = f"inspect_step_{mode}"
    picked = [point["first_step"] for point in event.selection.get("step", []) if "first_step" in point]
    if picked and st.session_state.get(step_key + "_picked") != picked[0]:
        st.session_state[step_key + "_picked"] = picked[0]
        st.session_state[step_key] = picked[0] + 1  # the slider counts steps from 1
    number = st.slider("Step", 1, len(record.steps), key=step_key) if len(record.steps) > 1 else 1
    step_section(record.steps[number - 1], labels, decode)
    mask_section(record, number - 1, mode, labels)


def step_section(step: StepEvent, labels: dict[str, str], decode: Decode) -> None:
    """One forward pass: its rows, the packed sequence the linear layers saw, and the token budget it used."""
    packed = sum(row.tokens + row.padding for row in step.rows)
    budget = step.token_budget or packed
    st.progress(min(1.0, packed / budget), text=f"{packed} tokens packed into this step, of a budget of {budget}")
    st.dataframe(step_rows_frame(step, labels), hide_index=True, width="stretch")
    st.caption(
        "The packed sequence (one colour per request, padding outlined in red): every row's new tokens side by side "
        "in one sequence, so the linear layers compute real tokens only. Other users' tokens show as •."
    )
    st.html(packed_sequence_html(packed_tokens(step, labels, decode)))


def mask_section(record: RunRecord, number: int, mode: str, labels: dict[str, str]) -> None:
    """The attention mask of step `number` as the engine built it (per sliding window), and a static wave's padded
    rectangle."""
    mask = record.steps[number].mask
    if mask is None:
        st.info("This step carries no description of its attention mask.")
        return
    windows = mask.windows
    picked = 0
    if len(windows) > 1:  # by index: None (full attention) would read as "nothing picked"
        names = [window_name(window) for window in windows]
        picked = st.radio(
            "Layers", range(len(windows)), horizontal=True, key=f"mask_{mode}", format_func=names.__getitem__
        )
    window = windows[picked]
    frame, stride = mask_frame(record.steps[number], labels, window)
    if stride > 1:
        st.caption(
            f"This step's mask has {mask.queries:,} queries × {mask.keys:,} keys: drawn at one query and one key in "
            f"{stride}; hover a cell for the query and key it stands for."
        )
    title = f"step {number + 1}: attention mask ({window_name(window)} layers)"
    st.altair_chart(mask_chart(frame, stride, title), width="stretch")
    st.caption(MASK_CAPTION)
    rectangle = padded_rectangle(record, number) if record.mode == "static" else None
    if rectangle is not None:
        st.markdown(
            f"**Padded rectangle:** {rectangle.rows} rows × {rectangle.columns} columns = {rectangle.cells:,} cells "
            f"in the wave's cache after this step; **{rectangle.padding:,} of them padding "
            f"({rectangle.padding_share:.0%})**: left padding up to the longest prompt, and the padding tokens "
            "finished members computed while they held their slot."
        )


# --- 5. the numbers ----------------------------------------------------------------------------------------------
def numbers_section(
    runs: dict[str, RunRecord], meters: dict[str, WasteMeters], others_seen: bool, race: RaceRun | None = None
) -> None:
    summaries = {mode: summarize(record) for mode, record in runs.items()}
    st.header("5 · The numbers")
    if "static" in summaries and (race is None or race.completed):
        factor = export.speedup(summaries["continuous"], summaries["static"])
        st.subheader(f"Same queue, same model, same batch size: {export.speedup_sentence(factor)}")
    elif race is not None:
        st.info("No speed-up: the race was stopped or some prompts did not finish; the figures cover what ran.")
    st.dataframe(export.comparison_frame(summaries, meters), width="content")
    notes = [
        "Latency counts from when a request arrived; occupancy is working slots ÷ batch size, averaged over steps."
    ]
    if race is not None:
        notes.append(RACE_CLOCKS)
    elif "static" in summaries:
        notes.append(
            "Continuous and static were measured the same way after your run: the same prompts, caps, sampling, "
            "arrival times and slots on private batchers, each twice (continuous, static, static, continuous), "
            "keeping the faster. The live column is the run you watched, which shared the machine with the page "
            "drawing it."
        )
    kinds = "; ".join(f"{mode}: {steps_kind(record)}" for mode, record in runs.items())
    notes.append(f"Steps — {kinds} (no compile ran during any of them: the engine holds compiles while it works).")
    if others_seen:
        notes.append(
            "Other people's requests shared the engine during your live run (purple in the live charts), so its "
            "figures include their load."
        )
    st.caption(" ".join(notes))


# --- 6. export ---------------------------------------------------------------------------------------------------
def export_section(runs: dict[str, RunRecord], run: LiveRun, setup: dict) -> None:
    """Per-request and per-step CSVs and one JSON of every run (`run` gives the prompts and their labels)."""
    labels = run.labels()
    prompts = {view.request_id: view.prompt for view in run.views if view.request_id}
    st.header("6 · Export")
    requests_csv = export.to_csv(export.requests_table(runs, labels, prompts))
    steps_csv = export.to_csv(export.steps_table(runs, labels))
    json_doc = export.to_json(runs, labels, prompts, setup)
    c1, c2, c3 = st.columns(3)
    c1.download_button("Requests (CSV)", requests_csv, "batchscope-requests.csv", "text/csv", on_click="ignore")
    c2.download_button("Steps (CSV)", steps_csv, "batchscope-steps.csv", "text/csv", on_click="ignore")
    c3.download_button("Everything (JSON)", json_doc, "batchscope-run.json", "application/json", on_click="ignore")


# --- a remote server instead of the built-in engine ------------------------------------------------------------
REMOTE_NOTE = (
    "Remote server: every time here is measured by this page's client, so it includes the network and whatever "
    "else the server is doing for other clients. The server batches as it likes; continuous keeps up to N requests "
    "in flight, static sends waves of N and waits for each wave's slowest answer (N = the batch size slider)."
)
REMOTE_LIVE = "Live: your run, drawn as it happens."
REMOTE_AFTER = {
    "continuous": "The same queue sent again with up to N in flight (continuous batching from the client), after the "
    "live run.",
    "static": "The same queue sent again in waves of N (static batching from the client), after the live run.",
}
REMOTE_CAPTIONS = {
    "occupancy": (
        f"Requests this page had in flight, sampled every {SAMPLE_EVERY_S:g} s; the dashed line is N. Amber: answers "
        "already finished but still holding their place in a static wave."
    ),
    "latency": charts.CAPTIONS["latency"],
    "timeline": "One row per client lane (a request in flight), one bar per request holding it.",
    "server": TELEMETRY_CAPTION,
}
REMOTE_ROWS = ("occupancy", "latency", "timeline", "server")


@dataclass(frozen=True)
class RemoteChoice:
    """The remote server chosen in the sidebar: where, which model and API, or the one line saying what is wrong."""

    endpoint: Endpoint | None
    model: str | None
    api: Api
    telemetry_every_s: float
    problem: str | None = None


@st.cache_data(ttl=10, show_spinner=False)
def served_model(endpoint: Endpoint) -> tuple[str | None, str | None]:
    """The model `/v1/models` lists first, or the reason there is none (asked again after 10 s at most)."""
    try:
        return fetch_model(endpoint), None
    except RemoteError as exc:
        return None, str(exc)


def remote_choice(settings: Settings) -> RemoteChoice | None:
    """The sidebar's engine choice: None for the built-in engine, else the remote server to run the queue on."""
    remote = settings.remote
    with st.sidebar:
        st.header("Engine to watch")
        kind = st.radio(
            "Engine",
            ["built-in", "remote server"],
            index=1 if remote.url else 0,
            horizontal=True,
            key="engine_kind",
            help="A remote server: any OpenAI-compatible endpoint (vLLM, SGLang, TGI, llama.cpp, transformers serve…).",
        )
        if kind == "built-in":
            return None
        url = st.text_input("Server URL", remote.url or "http://127.0.0.1:8000", key="remote_url")
        api_key = st.text_input("API key", remote.api_key or "", type="password", key="remote_key")
        typed_model = st.text_input(
            "Model (blank: the first one /v1/models lists)", remote.model or "", key="remote_model"
        )
        api: Api = st.radio(
            "API", APIS, index=APIS.index(remote.api), horizontal=True, key="remote_api", format_func="/v1/{}".format
        )
        try:
            endpoint = endpoint_from_settings(remote, url, api_key)
        except RemoteError as exc:
            st.error(str(exc))
            return RemoteChoice(None, None, api, remote.telemetry_interval_s, str(exc))
        model, problem = (typed_model.strip(), None) if typed_model.strip() else served_model(endpoint)
        if problem:
            st.error(problem)
        else:
            st.caption(f"Watching model **{escape_markdown(model or '')}** at {escape_markdown(endpoint.root)}")
    return RemoteChoice(endpoint, model, api, remote.telemetry_interval_s, problem)


def remote_order(compare: bool) -> tuple[Mode, ...]:
    """The modes in the order they run. Each comparison in this tab starts with the mode the last one ran second:
    the second run meets a server the first has just used (its prefix cache, its allocator), so neither always does."""
    if not compare:
        return ("continuous",)
    count = st.session_state.get("remote_comparisons", 0)
    st.session_state.remote_comparisons = count + 1
    return MODES if count % 2 == 0 else MODES[::-1]


def start_remote_run(page: Page, queue: PromptQueue) -> None:
    """Warm the server up, then plan the queue as for the built-in engine, on a remote run in the first mode."""
    state = st.session_state
    remote = page.remote
    assert remote is not None
    if remote.problem or remote.endpoint is None or remote.model is None:
        state.queue_message = remote.problem or "choose a remote server first (sidebar)"
        return
    choices = page.choices
    setup = RunSetup(remote.endpoint, remote.model, choices.batch_size, "continuous", remote.api, choices.system_prompt)
    try:
        with st.spinner("Warming the server up with one short request…"):
            warm = warm_up(setup, page.formatted(WARM_UP_QUESTION))
    except RemoteError as exc:
        state.queue_message = str(exc)
        return
    order = remote_order(choices.compare)
    setup = replace(setup, mode=order[0])
    started = LiveRun(time.perf_counter(), "", choices.batch_size, choices.sampling, mode=order[0])
    schedule = choices.schedule(len(queue))
    for item, offset in zip(queue.items, schedule.due, strict=True):
        started.plan(item.prompt, page.formatted(item.prompt), item.max_new_tokens, offset)
    state.run, state.run_items = started, {item.item_id for item in queue.items}
    state.run_session = RemoteRun(setup, start=started.start, telemetry_every_s=remote.telemetry_every_s)
    state.remote_second = None
    state.run_setup = {
        "engine": "remote",
        "url": remote.endpoint.root,
        "model": remote.model,
        "api": f"/v1/{remote.api}",
        "requests_in_flight": choices.batch_size,
        "sampling": asdict(choices.sampling),
        "arrivals": schedule.description,
        "system_prompt": choices.system_prompt,
        "compare": choices.compare,
        "warm_up_s": round(warm.seconds, 3),
        "order": list(order),
    }
    state.queue_message = None


@dataclass(frozen=True)
class RemoteLayout:
    """Section 3 of a remote run: a progress slot for the static pass, and each row's two sides."""

    progress: DeltaGenerator
    notes: tuple[DeltaGenerator, DeltaGenerator]
    slots: dict[str, tuple[DeltaGenerator, DeltaGenerator]]


def remote_layout(live: Mode) -> RemoteLayout:
    st.header("3 · What the client and the server saw")
    progress = st.empty()
    left, right = st.columns(2, gap="large")
    left.subheader("Continuous: up to N in flight")
    right.subheader("Static: waves of N")
    notes = (left.empty(), right.empty())
    for note, mode in zip(notes, MODES, strict=True):
        note.caption(REMOTE_LIVE if mode == live else REMOTE_AFTER[mode])
    slots = {}
    for name in REMOTE_ROWS:
        left, right = st.columns(2, gap="large")
        slots[name] = (left.empty(), right.empty())
        left.caption(REMOTE_CAPTIONS[name])
        right.caption(REMOTE_CAPTIONS[name])
    return RemoteLayout(progress, notes, slots)


def draw_remote(
    layout: RemoteLayout, column: int, remote: RemoteRun, latency: pd.DataFrame, labels: dict[str, str], x_max: dict
) -> None:
    """One remote run's client charts (the built-in engine's own builders) and the server's telemetry."""
    record, lanes = remote.record, remote.setup.lanes
    occupancy = charts.occupancy_chart(
        charts.occupancy_frame(record),
        lanes,
        title="Requests in flight from this page",
        x_max=x_max.get("steps"),
        x_title=f"client sample (every {SAMPLE_EVERY_S:g} s)",
    )
    layout.slots["occupancy"][column].altair_chart(occupancy, width="stretch")
    layout.slots["latency"][column].altair_chart(
        charts.latency_chart(charts.latency_bars_frame(latency), x_max=x_max.get("seconds")), width="stretch"
    )
    timeline = charts.timeline_frame(record, labels)
    layout.slots["timeline"][column].altair_chart(
        charts.timeline_chart(timeline, lanes, title="Client lanes", x_max=x_max.get("seconds")), width="stretch"
    )
    samples = remote.telemetry()
    server = layout.slots["server"][column].container()
    if samples:
        frame = telemetry_frame(samples, record.start)
        server.altair_chart(telemetry_chart(frame, x_max=x_max.get("seconds")), width="stretch")
    sources = (
        {}
        if remote.poller is None
        else {"/metrics": remote.poller.metrics_available, "/slots": remote.poller.slots_available}
    )
    server.caption(reported_line(samples, sources))


def stream_remote(
    run: LiveRun,
    remote: RemoteRun,
    compare: bool,
    progress: DeltaGenerator,
    answers: list[AnswerSlots],
    layout: RemoteLayout,
) -> None:
    """The streaming loop of a remote run: the same `Stream` as the built-in engine's, drawing remote charts."""
    streaming = Stream(run, remote, compare)
    while True:
        redraw = streaming.tick()
        for index, view in redraw.answers:
            draw_answer(view, answers[index])
        if redraw.progress:
            progress.markdown(run.progress_line(redraw.now))
            if redraw.live_charts:
                column = MODES.index(remote.setup.mode)
                draw_remote(layout, column, remote, run.latency_frame(redraw.now), run.labels(), {})
            streaming.charts_drawn(redraw.now)
        if redraw.done:
            remote.close()
            return
        time.sleep(streaming.pause())


def second_remote(run: LiveRun, live: RemoteRun, mode: Mode, slot: DeltaGenerator) -> RemoteRun:
    """The same queue sent again in the other mode (started once, resumed by later script runs), with a progress bar."""
    state = st.session_state
    second: RemoteRun | None = state.get("remote_second")
    if second is None:
        second = RemoteRun(
            replace(live.setup, mode=mode), telemetry_every_s=live.poller.every_s if live.poller else None
        )
        state.remote_second_labels = {}
        for view in run.views:
            if view.request_id is not None:
                submitted = second.submit(view.formatted, run.params(view), at=view.offset_s)
                state.remote_second_labels[submitted.request_id] = f"#{view.number}"
        second.close()
        state.remote_second = second
    total = len(state.remote_second_labels)
    while not second.done:
        done = len(second.record.finished)
        text = f"{mode.capitalize()} batching from the client: {done} of {total} answers"
        slot.progress(done / max(total, 1), text=text)
        time.sleep(0.2)
    slot.empty()
    return second


def remote_order_line(setup: dict) -> str:
    """What the server was sent before the timed runs, and which run went first."""
    return (
        f"Warm-up: one short request ({setup['warm_up_s']:.2f} s) before anything was timed, counted in no figure. "
        f"This time {setup['order'][0]} ran first (live). Which runs first alternates with each comparison, so "
        "neither always meets the server just after the other."
    )


def remote_failures(runs: dict[str, RemoteRun]) -> None:
    """One message per kind of failure (with how many requests it hit); the other requests went on."""
    for mode, remote in runs.items():
        errors: dict[str, int] = {}
        for event in remote.record.finished:
            if event.error:
                errors[event.error] = errors.get(event.error, 0) + 1
        for message, count in errors.items():
            st.error(f"{mode}: {count} of {len(remote.record.finished)} requests failed: {message}")


def remote_numbers(runs: dict[str, RemoteRun]) -> None:
    summaries = {mode: summarize(remote.record) for mode, remote in runs.items()}
    st.header("5 · The numbers")
    if "static" in summaries:
        factor = export.speedup(summaries["continuous"], summaries["static"])
        st.subheader(f"Same queue, same server, same N: {export.speedup_sentence(factor)}")
    table = export.comparison_frame(summaries).drop(index="engine steps")
    st.dataframe(table.rename(index={"mean occupancy": "mean requests in flight ÷ N"}), width="content")
    st.caption(
        "Measured by this page's client: latency counts from when a request was due; output tokens are the "
        "server's own counts when it reports usage. The times include the network and the server's other load."
    )


def remote_export(runs: dict[str, RemoteRun], labels: dict[str, str], prompts: dict[str, str], setup: dict) -> None:
    st.header("6 · Export")
    records = {mode: remote.record for mode, remote in runs.items()}
    telemetry = [
        telemetry_table(remote.telemetry(), remote.record.start).assign(run=mode) for mode, remote in runs.items()
    ]
    c1, c2, c3, c4 = st.columns(4)
    c1.download_button(
        "Requests (CSV)",
        export.to_csv(export.requests_table(records, labels, prompts)),
        "batchscope-requests.csv",
        "text/csv",
        on_click="ignore",
    )
    c2.download_button(
        "Client samples (CSV)",
        export.to_csv(export.steps_table(records, labels)),
        "batchscope-steps.csv",
        "text/csv",
        on_click="ignore",
    )
    c3.download_button(
        "Server telemetry (CSV)",
        export.to_csv(pd.concat(telemetry, ignore_index=True)),
        "batchscope-telemetry.csv",
        "text/csv",
        on_click="ignore",
    )
    c4.download_button(
        "Everything (JSON)",
        export.to_json(records, labels, prompts, setup),
        "batchscope-run.json",
        "application/json",
        on_click="ignore",
    )


def remote_sections(run: LiveRun, compare: bool, buttons: RunButtons) -> None:
    """Sections 2, 3, 5 and 6 for a run on a remote server (no step detail: the server's steps are not visible)."""
    state = st.session_state
    live: RemoteRun = state.run_session
    st.info(REMOTE_NOTE)
    st.caption(remote_order_line(state.run_setup))
    progress, answers = answers_section(run)
    layout = remote_layout(live.setup.mode)
    stream_remote(run, live, compare, progress, answers, layout)
    found: dict[str, RemoteRun] = {live.setup.mode: live}
    if compare and run.completed:
        other = next(mode for mode in MODES if mode != live.setup.mode)
        found[other] = second_remote(run, live, other, layout.progress)
    runs: dict[str, RemoteRun] = {mode: found[mode] for mode in MODES if mode in found}  # the tables' order
    buttons.run_ended()
    labels = {**run.labels(), **state.get("remote_second_labels", {})}
    prompts = {view.request_id: view.prompt for view in run.views if view.request_id}
    prompts |= {
        rid: run.views[int(label[1:]) - 1].prompt for rid, label in state.get("remote_second_labels", {}).items()
    }
    walls = [remote.record.wall_s for remote in runs.values() if math.isfinite(remote.record.wall_s)]
    shared = {"seconds": max(walls, default=None), "steps": max(len(remote.record.steps) for remote in runs.values())}
    for column, mode in enumerate(MODES):
        if mode in runs:
            latency = charts.latency_frame(runs[mode].record, labels)
            draw_remote(layout, column, runs[mode], latency, labels, shared)
        else:
            layout.slots["occupancy"][column].info(
                "The comparison is switched off (sidebar)."
                if not compare
                else "No comparison: the run was stopped or some prompts did not finish."
            )
    remote_failures(runs)
    remote_numbers(runs)
    remote_export(runs, labels, prompts, state.run_setup)


# --- the page ------------------------------------------------------------------------------------------------------
def main() -> None:
    configure_logging()
    st.set_page_config(page_title="Batchscope", page_icon="🔭", layout="wide")
    st.title("Batchscope")
    st.caption(INTRO)

    settings = settings_or_stop()
    service = model_or_stop(settings)
    info = service.info
    builder = service.builder(engine_options(settings, settings.batching.max_batch_size, settings.batching.policy))
    st.caption(
        f"Model **{escape_markdown(info.name)}** · {info.num_parameters / 1e6:.1f} M parameters · "
        f"{info.device} · {info.dtype} · context {builder.context_length} tokens"
        + (f" · {info.features}" if info.features else "")  # e.g. "sliding window 512 on 5 of 6 layers, soft-cap 50"
    )

    remote = remote_choice(settings)
    choices = sidebar(settings, remote is not None)
    options = engine_options(settings, choices.batch_size, choices.policy)
    shared_engine(service, settings)
    page = Page(settings, service, builder, choices, options, remote)
    init_state(settings, builder.max_new_tokens)

    buttons = queue_section(page)
    run: LiveRun | RaceRun | None = st.session_state.run
    if run is None:
        return
    if isinstance(run, RaceRun):
        race_page(service, run, buttons)
        return
    if isinstance(st.session_state.run_session, RemoteRun):  # the run went to a remote server: its own sections
        remote_sections(run, choices.compare, buttons)
        return
    progress_slot, answer_slots = answers_section(run)
    layout = charts_section()
    stream(run, st.session_state.run_session, choices.compare, progress_slot, answer_slots, layout)
    if choices.compare and run.completed:
        replay_all(page, run, st.session_state.run_setup["engine"], layout.replay)
    buttons.run_ended()
    runs = comparison_charts(run, choices.compare, layout)
    meters = {mode: waste_meters(record) for mode, record in runs.items()}  # each run's, read by both sections
    inspector_section(runs, meters, run.labels(), lambda ids: str(service.tokenizer.decode(list(ids))))
    numbers_section(runs, meters, run.others_seen)
    export_section(runs, run, st.session_state.run_setup)


def race_page(service: EngineClient, race: RaceRun, buttons: RunButtons) -> None:
    """Sections 2-6 for a race: both lanes stream live, then the same inspector, numbers and export."""
    progress_slot, answer_slots = race_answers_section(race)
    layout = charts_section(RACE_NOTES)
    race_stream(race, st.session_state.race_handle, progress_slot, answer_slots, layout)
    if buttons.running:  # the race ended during this script run
        st.session_state.race_handle.close()
        buttons.run_ended()
    runs = race.runs()
    meters = {mode: waste_meters(record) for mode, record in runs.items()}
    inspector_section(runs, meters, race.labels(), lambda ids: str(service.tokenizer.decode(list(ids))), LANE_RUN_NAMES)
    numbers_section(runs, meters, False, race)
    export_section(runs, race.lanes["continuous"], st.session_state.run_setup)


if __name__ == "__main__":
    main()
