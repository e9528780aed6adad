"""The frame every view sits in (`streamlit_app.py` draws it): the settings, the engine's client (one per server,
shared by every tab), the model line, the engine's lines in the sidebar, the queue kept across views, and `Frame`,
what the frame hands the view it runs."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from app.common.prompt_queue import PromptQueue
from app.common.sidebar import Choices
from batching.engine.builder import RequestBuilder
from batching.engine.compiled import CompileState
from batching.engine.model_support import UnsupportedModelError
from batching.engine.options import BatcherOptions
from batching.engine.params import RequestParams
from batching.serve.server import BackgroundServer, start_background
from batching.service import EngineClient, EngineConfig, EngineDeadError, EngineInfo
from batching.service.client import engine_options
from config.settings import Settings, SettingsError, load_settings, setting_warnings
from model.gptq import require_gptq
from model.loader import BUILTIN_4BIT_NAME, BUILTIN_NAME, ModelLoadError
from model.prompting import format_prompt
from utils.plain_text import escape_markdown

KEY = "frame"  # where the frame leaves this script run's `Frame` for the view


class ViewRun(Protocol):
    """What the frame needs of any view's run (`app.common.view_run`)."""

    @property
    def running(self) -> bool: ...

    def let_go(self) -> None:
        """The person left the view: stop the run unless it is over or already stopped."""


@dataclass(frozen=True)
class View:
    """A view of the page: its script, its address (every script is a folder's `page.py`), its title in the
    navigation, and the session-state key of its run."""

    path: str
    url_path: str
    title: str
    run_key: str


@dataclass(frozen=True)
class Frame:
    """What a view is given: the settings, the shared engine, the request builder, the sidebar's shared choices,
    and a slot in the sidebar (above those choices) for the view's own controls."""

    settings: Settings
    service: EngineClient
    builder: RequestBuilder
    choices: Choices
    options: BatcherOptions  # the shared batcher the choices pick
    controls: DeltaGenerator
    chat_server: bool = False  # the queue goes to a server's chat API, which applies its own template

    def formatted(self, prompt: str) -> str:
        """The prompt as the engine is sent it: in the prompt template, after the system prompt."""
        if self.chat_server:
            return prompt
        return format_prompt(prompt, self.choices.system_prompt, self.settings.prompt.template)

    def check_prompt(self, prompt: str, cap: int) -> None:
        """Would the engine accept this prompt (with the system prompt around it) and this cap? ValueError if not."""
        self.builder.build(self.formatted(prompt), RequestParams(cap))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.service.tokenizer.decode(list(ids)))


def current_frame() -> Frame:
    """The frame of this script run (views are run by the frame, after it has left this here)."""
    frame: Frame = st.session_state[KEY]
    return frame


# --- resources shared by every tab of this process ---------------------------------------------------------
SERVICE_SETTINGS = {"model", "tokenizer", "engine", "limits", "batching"}  # what the engine process is made from


@st.cache_resource(show_spinner=False)
def get_service(settings_json: str) -> EngineClient:
    """The engine process of this server (it loads the model once), shared by every tab through one client. It
    starts making the default race's graphs as soon as it is ready: a race waits for its graphs before it steps."""
    settings = Settings.model_validate_json(settings_json)
    config = EngineConfig(
        settings.model, settings.tokenizer, settings.engine, background_graphs=engine_options(settings)
    )
    return EngineClient(config, settings.limits)


@st.cache_resource(show_spinner=False)
def get_api(_service: EngineClient, settings_json: str, port: int) -> BackgroundServer:
    """The API inside this process, once per server: its requests and the tabs' share the engine's batches."""
    return start_background(_service, Settings.model_validate_json(settings_json), port)


# --- settings and model, or one message and nothing else -------------------------------------------------------
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


# The embedded model's two variants the sidebar offers (each its own engine process, loaded when first picked).
MODEL_VARIANTS = {
    BUILTIN_NAME: "Embedded model, float32",
    BUILTIN_4BIT_NAME: "Embedded model, 4-bit GPTQ (quantised on first use)",
}


def model_choice(settings: Settings) -> Settings:
    """The settings with the model the sidebar picks: the embedded model or its 4-bit copy, offered when the
    settings name one of them and no API shares this page's engine (`BATCHSCOPE_SERVER__PORT`)."""
    configured = settings.model.name_or_path
    if configured not in MODEL_VARIANTS or settings.server.port is not None:
        return settings
    variants = list(MODEL_VARIANTS)
    chosen = st.sidebar.selectbox(
        "Weights", variants, index=variants.index(configured), format_func=MODEL_VARIANTS.__getitem__, key="weights"
    )
    if chosen == BUILTIN_4BIT_NAME:
        try:
            require_gptq("The 4-bit model")
        except ModelLoadError as exc:
            st.sidebar.warning(escape_markdown(str(exc)))
            chosen = BUILTIN_NAME
    model = settings.model.model_copy(update={"name_or_path": chosen})
    return settings.model_copy(update={"model": model})


def model_or_stop(settings: Settings) -> EngineClient:
    """The engine process with the model loaded (started by the first page load of this server)."""
    try:
        with st.spinner(f"Loading the model `{settings.model.name_or_path}` (once per server)…"):
            return get_service(settings.model_dump_json(include=SERVICE_SETTINGS))
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


def model_line(info: EngineInfo, builder: RequestBuilder) -> str:
    """The model's name, size, device, dtype, context and attention features, in one line."""
    return (
        f"Model **{escape_markdown(info.name)}** · {info.num_parameters / 1e6:.1f} M parameters · "
        f"{info.device} · {info.weights or info.dtype} · context {builder.context_length} tokens"
        + (f" · {info.features}" if info.features else "")  # e.g. "sliding window 512 on 5 of 6 layers, soft-cap 50"
    )


# --- the engine's lines in the sidebar ---------------------------------------------------------------------------
def engine_lines(service: EngineClient, settings: Settings) -> None:
    """Say that the engine process is being restarted, or start it again if it was restarted too often; say how
    many batchers are live, and where the OpenAI-compatible API of this server listens when
    `BATCHSCOPE_SERVER__PORT` is set."""
    engine = service.lifecycle
    try:
        if engine.ensure_running():
            st.warning(escape_markdown(f"The shared engine had stopped ({engine.last_error}); it was started again."))
    except EngineDeadError as exc:
        st.warning(escape_markdown(f"{str(exc)[:1].upper()}{str(exc)[1:]}."))
    st.sidebar.caption(
        f"Batchers live: {engine.stats.live_batchers} (at most {settings.engine.max_shared_batchers} shared)"
    )
    st.sidebar.caption(compile_caption(engine.stats.compile))
    port = settings.server.port
    if port is not None:
        get_api(service, settings.model_dump_json(), port)
        st.sidebar.caption(f"OpenAI-compatible API: http://{settings.server.host}:{port}/v1 (same engine as this page)")


def compile_caption(state: CompileState) -> str:
    """One line on the decode steps: eager, being compiled in the background, or compiled."""
    if state.stage == "compiled":
        return (
            f"Decode steps: compiled (the slowest graph took {state.seconds:.0f} s to make, once per batch size; "
            "steps with prompt chunks get a graph of their own once the decode graph is made)."
        )
    return {
        "off": "Decode steps: eager (compiling is off: BATCHSCOPE_ENGINE__COMPILE_STEPS=false).",
        "waiting": "Decode steps: eager; the first run starts compiling them in the background.",
        "compiling": "Decode steps: their graphs are being made in the background, only while the engine is idle "
        "(the compile pauses while anything runs, so it never slows a run or its figures); a race waits for them.",
        "failed": "Decode steps: eager; they could not be compiled here (the engine's log says why).",
    }[state.stage]


# --- session state every view shares ------------------------------------------------------------------------------
def keep_queue(settings: Settings, max_cap: int) -> None:
    """The canonical queue (the table only shows it) and its message: one per tab, kept across views."""
    state = st.session_state
    if "queue" not in state:
        state.queue = PromptQueue(settings.limits.max_queue_per_session, max_cap)
        state.queue_message = None


def let_go_of_runs_elsewhere(views: Iterable[View], shown: View) -> None:
    """A run still going in a view the person has left is stopped: nothing polls it there, and the engine would
    drop a session nobody polls (its answers lost), leaving the view to wait for them when the person comes back."""
    for view in views:
        run: ViewRun | None = st.session_state.get(view.run_key)
        if view != shown and run is not None:
            run.let_go()
