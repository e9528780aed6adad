"""Batchscope: watch continuous batching of LLM inference happen, and measure why it beats static batching.

The page only draws. The engine (`batching/`) runs one continuous batcher per process in a background thread,
shared by every browser tab; `utils/` turns its events into the queue view, frames, charts and files.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict

import pandas as pd
import streamlit as st
import torch

from batching.arrivals import Schedule
from batching.bench.workloads import builtin_workload_names, load_workload
from batching.engine.batcher import Batcher, BatcherOptions, request_builder
from batching.engine.events import FinishedEvent
from batching.engine.model_support import UnsupportedModelError, attention_features, check_supported
from batching.engine.params import RequestParams, SamplingParams
from batching.service import EngineService, ServiceLimits, Session
from config.settings import ModelSettings, Settings, SettingsError, TokenizerSettings, load_settings
from model.loader import LoadedModel, ModelLoadError, load_model
from model.prompting import format_prompt
from utils import charts, export
from utils.metrics import RunRecord, summarize
from utils.queue import REPLAY_ORDER, LiveRun, PromptQueue, QueueError, RequestView, escape_markdown, has_edits

SMALL_MODEL = 50_000_000  # parameters; below this the CPU runs torch on one thread (see get_model)
# While streaming, the page redraws answers and charts at most this often: the engine thread shares the GIL
# with this script, so every redraw slows the engine down a little. Charts also wait 4x as long as they took.
TEXT_REDRAW_S = 0.1
CHART_REDRAW_S = 0.5
DEFAULT_EXAMPLE = "customer-support"
CONTINUOUS_LIVE = "Live: your run on the shared engine, drawn as it happens."
CONTINUOUS_REPLAYED = "Your queue replayed on a private continuous batcher, measured the same way as static batching."
STATIC_LATER = "The same queue on a private static batcher (fixed waves), measured after your run."
ARRIVALS = ("all at once", "staggered", "Poisson")
POLICY_NAMES = {
    "fcfs": "first come, first served",
    "shortest-first": "shortest cap first",
    "longest-first": "longest cap first",
}

st.set_page_config(page_title="Batchscope", page_icon="🔭", layout="wide")


# --- resources shared by every tab of this process ---------------------------------------------------------
@st.cache_resource(show_spinner=False)
def get_model(model_json: str, tokenizer_json: str) -> LoadedModel:
    """Load once per process, then run one tiny request so the first real one does not pay for warm-up."""
    loaded = load_model(
        ModelSettings.model_validate_json(model_json), TokenizerSettings.model_validate_json(tokenizer_json)
    )
    if loaded.device.type == "cpu" and loaded.num_parameters < SMALL_MODEL and "OMP_NUM_THREADS" not in os.environ:
        # A small model's ops are too short to split: on shared cores, more threads mostly wait on each other.
        torch.set_num_threads(1)
    check_supported(loaded.model)  # refused here, before any request, rather than answered wrongly
    warm = Batcher(loaded.model, loaded.tokenizer, BatcherOptions(max_batch_size=1, max_batched_tokens=64))
    warm.add("Hello", RequestParams(2))
    for _ in warm.run():
        pass
    return loaded


@st.cache_resource(show_spinner=False)
def get_service(
    model_json: str, tokenizer_json: str, options: tuple[tuple[str, object], ...], limits: tuple[int, int]
) -> EngineService:
    """One shared engine per (model, engine options): tabs choosing the same batch size and policy share a batch."""
    loaded = get_model(model_json, tokenizer_json)
    per_session, total = limits
    return EngineService(
        lambda: Batcher(loaded.model, loaded.tokenizer, BatcherOptions(**dict(options))),
        ServiceLimits(max_queue_per_session=per_session, max_queue_total=total),
    )


def engine_options(settings: Settings, batch_size: int, policy: str) -> BatcherOptions:
    """The batcher options for the page's choices; the shared engine and the replays both use them."""
    return BatcherOptions(
        max_batch_size=batch_size,
        max_batched_tokens=max(settings.batching.max_batched_tokens, batch_size + 1),
        policy=policy,
        max_seq_len=settings.batching.max_seq_len,
        max_prompt_tokens=settings.tokenizer.max_prompt_tokens,
    )


# --- settings and model --------------------------------------------------------------------------------------
st.title("Batchscope")
st.caption(
    "Queue some prompts, press Generate and watch one shared engine answer them together. Continuous batching "
    "gives a slot to a waiting request the moment another finishes; static batching waits for the whole batch. "
    "The charts and the comparison show what that is worth."
)

try:
    settings: Settings = load_settings()
except SettingsError as exc:
    st.error(f"A setting is not valid: {exc}")
    st.info("Fix that environment variable (or the line in `.env`) and reload the page.")
    st.stop()

model_key = (settings.model.model_dump_json(), settings.tokenizer.model_dump_json())
try:
    with st.spinner(f"Loading the model `{settings.model.name_or_path}` (once per server)…"):
        loaded = get_model(*model_key)
except ModelLoadError as exc:
    st.error(f"The model could not be loaded: {exc}")
    st.info("Change that setting (environment variable or `.env`) and restart the app.")
    st.stop()
except UnsupportedModelError as exc:  # loaded, but the engine cannot run it exactly
    st.error(str(exc))
    st.stop()
except Exception as exc:  # a broken model folder can fail in many ways; the page still explains, not a traceback
    st.error(
        f"The model could not be loaded ({type(exc).__name__}: {str(exc)[:200]}); "
        "check BATCHSCOPE_MODEL__NAME_OR_PATH and the model files."
    )
    st.stop()

builder = request_builder(
    loaded.model, loaded.tokenizer, engine_options(settings, settings.batching.max_batch_size, settings.batching.policy)
)
max_cap = builder.max_new_tokens
features = attention_features(loaded.model)  # e.g. "sliding window 512 on 5 of 6 layers, soft-cap 50"; "" if plain
st.caption(
    f"Model **{escape_markdown(loaded.name)}** · {loaded.num_parameters / 1e6:.1f} M parameters · "
    f"{loaded.device} · {str(loaded.dtype).removeprefix('torch.')} · context {builder.context_length} tokens"
    + (f" · {features}" if features else "")
)

# --- sidebar: how the engine runs -----------------------------------------------------------------------------
gen = settings.generation
with st.sidebar:
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
    policy = st.selectbox(
        "Scheduling policy",
        policies,
        index=policies.index(settings.batching.policy),
        format_func=POLICY_NAMES.get,
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
    sampling = SamplingParams(sample, temperature, int(top_k), top_p, repetition_penalty, int(seed))
    st.header("Prompt")
    system_prompt = st.text_area("System prompt", settings.prompt.system_prompt, height=100)
    st.header("Arrivals")
    kind = st.radio(
        "How requests join",
        ARRIVALS,
        help="Staggered and Poisson arrivals make requests join a batch that is already running.",
        key="arrivals",
    )
    interval = st.slider("Seconds between requests", 0.1, 3.0, 0.5, 0.1, key="interval") if kind == "staggered" else 0.5
    rate = st.slider("Requests per second", 0.5, 20.0, 4.0, 0.5, key="rate") if kind == "Poisson" else 2.0
    compare = st.checkbox("Compare with static batching afterwards", value=True, key="compare")

options = engine_options(settings, batch_size, policy)
service = get_service(
    *model_key, tuple(asdict(options).items()), (settings.limits.max_queue_per_session, settings.limits.max_queue_total)
)
if service.ensure_running():
    st.warning(f"The shared engine had stopped ({service.last_error}); it was restarted (restart {service.restarts}).")


def check_prompt(prompt: str, cap: int) -> None:
    """Would the engine accept this prompt (with the system prompt around it) and this cap? ValueError if not."""
    builder.build(format_prompt(prompt, system_prompt, settings.prompt.template), RequestParams(cap))


# --- session state: the canonical queue, the run, this tab's engine sessions ----------------------------------
state = st.session_state
if "queue" not in state:
    state.queue = PromptQueue(settings.limits.max_queue_per_session, max_cap)
    state.queue_message = None
    state.editor_version = 0
    state.run = None
    state.engine_sessions = {}
queue: PromptQueue = state.queue
run: LiveRun | None = state.run


def engine_session() -> Session:
    """This tab's handle on the engine it is using now (one per engine, reopened if it was reaped)."""
    session = state.engine_sessions.get(id(service))
    if session is None or session.closed:
        session = state.engine_sessions[id(service)] = service.open_session()
    return session


def on_add() -> None:
    try:
        queue.add(state.new_prompt, state.new_cap, check_prompt)
    except QueueError as exc:
        state.queue_message = str(exc)
        return
    state.queue_message = None
    state.new_prompt = ""


def on_load_example() -> None:
    workload = load_workload(state.example)
    pairs = [(r.prompt, r.max_new_tokens or gen.max_new_tokens) for r in workload.requests]
    try:
        queue.replace_all(pairs, check_prompt)
    except QueueError as exc:
        state.queue_message = f"{state.example}: {exc}"
        return
    state.queue_message = None
    state.editor_version += 1


def on_clear() -> None:
    queue.clear()
    state.queue_message = None
    state.editor_version += 1


def on_stop() -> None:
    if state.run is not None:
        state.run.stop()
        state.run_session.cancel_all()


def arrival_schedule(count: int) -> Schedule:
    """When each of `count` prompts joins, in seconds after Generate, as chosen in the sidebar."""
    if kind == "staggered":
        return Schedule.timed([i * interval for i in range(count)], f"one request every {interval:g} s")
    if kind == "Poisson":
        return Schedule.poisson(count, rate, int(seed))
    return Schedule.at_once(count)


def start_run() -> None:
    """Plan every queued prompt with its arrival time; the streaming loop below submits them when due."""
    if not len(queue):
        state.queue_message = "the queue is empty: add a prompt or load an example first"
        return
    session = engine_session()
    started = LiveRun(time.perf_counter(), session.session_id + "/", batch_size, sampling)
    schedule = arrival_schedule(len(queue))
    for item, offset in zip(queue.items, schedule.due, strict=True):
        started.plan(
            item.prompt,
            format_prompt(item.prompt, system_prompt, settings.prompt.template),
            item.max_new_tokens,
            offset,
        )
    state.run, state.run_session, state.run_items = started, session, {item.item_id for item in queue.items}
    state.run_setup = {
        "model": loaded.name,
        "engine": asdict(options),
        "sampling": asdict(sampling),
        "arrivals": schedule.description,
        "system_prompt": system_prompt,
        "compare": compare,
    }
    state.queue_message = None


# --- 1. the queue ------------------------------------------------------------------------------------------------
st.header("1 · Queue your prompts")
add_col, example_col = st.columns([3, 2], gap="large")
with add_col:
    st.text_input("Prompt", key="new_prompt", placeholder="e.g. How do I track my order?")
    cap_col, button_col = st.columns([2, 1], vertical_alignment="bottom")
    cap_col.number_input("Max new tokens", key="new_cap", value=gen.max_new_tokens, step=1)
    button_col.button("Add", on_click=on_add, type="primary", width="stretch")
with example_col:
    examples = builtin_workload_names()
    st.selectbox("Example workload", examples, index=examples.index(DEFAULT_EXAMPLE), key="example")
    load_col, clear_col = st.columns(2)
    load_col.button("Load example", on_click=on_load_example, width="stretch", help="Replaces the queue.")
    clear_col.button("Clear all", on_click=on_clear, width="stretch")

# Edits made in the table last time go into the canonical queue, then the table is drawn afresh from it.
editor_key = f"queue_editor_{state.editor_version}"
if has_edits(state.get(editor_key)):
    problems = queue.apply_edits(state[editor_key], check_prompt)
    state.queue_message = "; ".join(problems) or None
    state.editor_version += 1
    editor_key = f"queue_editor_{state.editor_version}"

if state.queue_message:
    st.error(state.queue_message)
st.data_editor(
    queue.frame(),
    key=editor_key,
    num_rows="delete",
    hide_index=False,
    disabled=["prompt"],
    width="stretch",
    column_config={
        "prompt": st.column_config.TextColumn("prompt", width="large"),
        "max_new_tokens": st.column_config.NumberColumn(
            "max new tokens", min_value=1, max_value=max_cap, step=1, help="Edit to change this prompt's cap."
        ),
    },
)
st.caption(
    f"{len(queue)} of {queue.max_items} prompts · edit a cap in the table, select rows and delete to remove them"
)

running = run is not None and not run.done
go_col, stop_col, _ = st.columns([1, 1, 4])
go_col.button("Generate", on_click=start_run, type="primary", disabled=running, width="stretch")
stop_col.button("Stop", on_click=on_stop, disabled=not running, width="stretch")

# Prompts added while a run is streaming join it at once: the engine is shared and keeps going.
if running:
    for item in queue.items:
        if item.item_id not in state.run_items:
            state.run_items.add(item.item_id)
            formatted = format_prompt(item.prompt, system_prompt, settings.prompt.template)
            run.plan(item.prompt, formatted, item.max_new_tokens, time.perf_counter() - run.start)

if run is None:
    st.stop()


# --- 2. answers, streaming -------------------------------------------------------------------------------------
def draw_answer(view: RequestView, slots: tuple) -> None:
    """A prompt's status line and its answer so far, as plain text (never markdown or HTML)."""
    status_slot, text_slot = slots
    status_slot.caption(view.status_line())
    text_slot.text(view.shown_text())


st.header("2 · Answers")
progress_slot = st.empty()
answer_slots: list[tuple] = []
for index, view in enumerate(run.views):
    if index % 2 == 0:
        row = st.columns(2)
    with row[index % 2].container(border=True):
        st.markdown(f"**#{view.number}** · {escape_markdown(view.prompt)}")
        answer_slots.append((st.empty(), st.empty()))
        draw_answer(view, answer_slots[-1])

# --- 3. charts -------------------------------------------------------------------------------------------------
st.header("3 · What the engine did")
replay_slot = st.empty()
left, right = st.columns(2, gap="large")
left.subheader("Continuous batching")
right.subheader("Static batching (same queue)")
column_notes = (left.empty(), right.empty())
column_notes[0].caption(CONTINUOUS_LIVE)
column_notes[1].caption(STATIC_LATER)
chart_slots = {}
for name in ("occupancy", "latency", "timeline"):  # one row per chart, so the two sides line up
    left, right = st.columns(2, gap="large")
    chart_slots[name] = (left.empty(), right.empty())
    left.caption(charts.CAPTIONS[name])
    right.caption(charts.CAPTIONS["occupancy_static" if name == "occupancy" else name])


def draw_charts(record: RunRecord, column: int, latency: pd.DataFrame, owns, x_max: dict | None = None) -> None:
    """One run's three charts into its column (0 continuous, 1 static); `x_max` shares axes between the two."""
    x_max = x_max or {}
    slots = run.slots
    occupancy = charts.occupancy_chart(charts.occupancy_frame(record, owns), slots, x_max=x_max.get("steps"))
    timeline = charts.timeline_frame(record, run.labels(), owns)
    chart_slots["occupancy"][column].altair_chart(occupancy, width="stretch")
    chart_slots["latency"][column].altair_chart(
        charts.latency_chart(charts.latency_bars_frame(latency), x_max=x_max.get("seconds")), width="stretch"
    )
    chart_slots["timeline"][column].altair_chart(
        charts.timeline_chart(timeline, slots, x_max=x_max.get("seconds")), width="stretch"
    )


# Stream: submit prompts as they come due, fold the engine's events in, redraw what changed (throttled).
# A click elsewhere stops this script run at its next redraw; the next run picks the same LiveRun up again.
session = state.run_session
drawn = {view.number: (view.status_line(), view.shown_text()) for view in run.views}
last_text = next_chart = 0.0
while True:
    for view in run.due(time.perf_counter()):
        try:
            request = session.submit(view.formatted, RequestParams(view.max_new_tokens, run.sampling))
        except (ValueError, RuntimeError) as exc:
            run.refuse(view, str(exc))
        else:
            run.submitted(view, request.request_id, request.times.arrival)
    run.fold(session.poll(timeout=TEXT_REDRAW_S))
    now = time.perf_counter()
    if now - last_text >= TEXT_REDRAW_S or run.done:
        last_text = now
        for view, slots in zip(run.views, answer_slots, strict=True):
            shown = (view.status_line(), view.shown_text())
            if drawn.get(view.number) != shown:
                drawn[view.number] = shown
                draw_answer(view, slots)
    comparing = run.done and compare and run.completed
    if now >= next_chart or run.done:
        progress_slot.markdown(run.progress_line(now))
        if not comparing:  # the replays' charts come next: spare the browser a redraw while they are measured
            draw_charts(run.record, 0, run.latency_frame(now), run.owns)
        next_chart = now + max(CHART_REDRAW_S, 4 * (time.perf_counter() - now))
    if run.done:
        break
    time.sleep(max(0.0, last_text + TEXT_REDRAW_S - time.perf_counter()))


# --- 3b. the comparison: the same queue replayed on private batchers, both measured the same way ------------------
# The live run shared its CPU with the page drawing it (and maybe with other users), so its timings are not a fair
# match for a static run; the headline compares two replays that only differ in how they batch. They run right after
# the live run, before the page is redrawn, so the browser is quiet while they are timed.
def replay_all() -> None:
    """Replay the queue in REPLAY_ORDER (resuming where an interrupted script run left off), with a progress bar."""
    total = len(REPLAY_ORDER) * len(run.views)
    while (mode := run.next_replay) is not None:
        done = run.replayed * len(run.views)
        text = f"Measuring: replay {run.replayed + 1} of {len(REPLAY_ORDER)}, {mode} batching"
        bar = replay_slot.progress(done / total, text=text)
        batcher = Batcher(loaded.model, loaded.tokenizer, BatcherOptions(**state.run_setup["engine"]), mode=mode)
        for event in run.replay(batcher):
            if isinstance(event, FinishedEvent):
                done += 1
                bar.progress(done / total, text=text)
    replay_slot.empty()


if compare and run.completed:
    replay_all()
if running:  # the run ended during this script run: redraw the page so Generate and Stop show it
    st.rerun()

labels = run.labels()
prompts = {view.request_id: view.prompt for view in run.views if view.request_id}
runs = {"live": run.record}
if not compare:
    chart_slots["occupancy"][1].info("The comparison is switched off (sidebar).")
elif not run.completed:
    chart_slots["occupancy"][1].info("No comparison: the run was stopped or some prompts did not finish.")
else:
    runs = {"continuous": run.replays["continuous"], "static": run.replays["static"], "live": run.record}
    shared = {
        "seconds": max(runs[mode].wall_s for mode in ("continuous", "static")),
        "steps": max(len(runs[mode].steps) for mode in ("continuous", "static")),
    }
    column_notes[0].caption(CONTINUOUS_REPLAYED)
    for column, mode in enumerate(("continuous", "static")):
        draw_charts(runs[mode], column, charts.latency_frame(runs[mode], labels), None, shared)

# --- 4. the numbers, 5. export ----------------------------------------------------------------------------------------
summaries = {mode: summarize(record) for mode, record in runs.items()}
st.header("4 · The numbers")
if "static" in summaries:
    factor = export.speedup(summaries["continuous"], summaries["static"])
    st.subheader(f"Same queue, same model, same batch size: {export.speedup_sentence(factor)}")
st.dataframe(export.comparison_frame(summaries), width="content")
notes = ["Latency counts from when a request arrived; occupancy is working slots ÷ batch size, averaged over steps."]
if "static" in summaries:
    notes.append(
        "Continuous and static were measured the same way after your run: the same prompts, caps, sampling, arrival "
        "times and slots on private batchers, each twice (continuous, static, static, continuous), keeping the "
        "faster. The live column is the run you watched, which shared the machine with the page drawing it."
    )
if run.others_seen:
    notes.append(
        "Other people's requests shared the engine during your live run (purple in the live charts), so its "
        "figures include their load."
    )
st.caption(" ".join(notes))

st.header("5 · Export")
requests_csv = export.to_csv(export.requests_table(runs, labels, prompts))
steps_csv = export.to_csv(export.steps_table(runs, labels))
json_doc = export.to_json(runs, labels, prompts, state.run_setup)
c1, c2, c3 = st.columns(3)
c1.download_button("Requests (CSV)", requests_csv, "batchscope-requests.csv", "text/csv", on_click="ignore")
c2.download_button("Steps (CSV)", steps_csv, "batchscope-steps.csv", "text/csv", on_click="ignore")
c3.download_button("Everything (JSON)", json_doc, "batchscope-run.json", "application/json", on_click="ignore")
