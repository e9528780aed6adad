"""The remote view's own control, drawn into the slot the frame keeps above the shared choices: the server to run
the queue on (its URL, key, model and API, a fleet's router and replicas), checked as it is typed."""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from batching.remote import APIS, Api, Endpoint, RemoteError, endpoint_from_settings, fetch_model
from batching.remote.fleet import replica_endpoints, replica_name
from config.settings import Settings
from utils.plain_text import escape_markdown


@dataclass(frozen=True)
class RemoteChoice:
    """The remote server chosen in the sidebar: where, which model and API, or the one line saying what is wrong."""

    endpoint: Endpoint | None
    model: str | None
    api: Api
    telemetry_every_s: float
    problem: str | None = None
    replicas: tuple[Endpoint, ...] = ()  # a fleet: the URL is its router, and each replica's /metrics are read


@st.cache_data(ttl=10, show_spinner=False)
def served_model(endpoint: Endpoint) -> tuple[str | None, str | None]:
    """The model `/v1/models` lists first, or the reason there is none (asked again after 10 s at most)."""
    try:
        return fetch_model(endpoint), None
    except RemoteError as exc:
        return None, str(exc)


@st.cache_data(ttl=10, show_spinner=False)
def fleet_replicas(router: Endpoint, typed: tuple[str, ...]) -> tuple[tuple[Endpoint, ...], str | None]:
    """The replicas behind `router`: those typed, else the router's own list (asked again after 10 s at most)."""
    try:
        return replica_endpoints(router, typed), None
    except RemoteError as exc:
        return (), str(exc)


def remote_server_choice(settings: Settings, controls: DeltaGenerator) -> RemoteChoice:
    """The server to run the queue on (the settings' by default), its key, model and API; problems said there."""
    remote = settings.remote
    with controls:
        st.header("Server")
        url = st.text_input(
            "Server URL",
            remote.url or "http://127.0.0.1:8000",
            key="remote_url",
            help="Any OpenAI-compatible endpoint (vLLM, SGLang, TGI, llama.cpp, transformers serve…).",
        )
        api_key = st.text_input("API key", remote.api_key or "", type="password", key="remote_key")
        typed_model = st.text_input(
            "Model (blank: the first one /v1/models lists)", remote.model or "", key="remote_model"
        )
        api: Api = st.radio(
            "API", APIS, index=APIS.index(remote.api), horizontal=True, key="remote_api", format_func="/v1/{}".format
        )
        fleet = st.checkbox(
            "A router in front of replicas (a fleet)",
            key="remote_fleet",
            help="vllm-router, sglang-router, llm-d's gateway…: the queue goes through it, and each replica's own "
            "/metrics are drawn side by side.",
        )
        typed = st.text_area(
            "Replicas, one per line (blank: the router's own list)", "", key="remote_replicas", disabled=not fleet
        )
        try:
            endpoint = endpoint_from_settings(remote, url, api_key)
        except RemoteError as exc:
            st.error(escape_markdown(str(exc)))  # the address typed, shown as text
            return RemoteChoice(None, None, api, remote.telemetry_interval_s, str(exc))
        replicas, problem = fleet_replicas(endpoint, _typed_lines(typed)) if fleet else ((), None)
        if problem is None and typed_model.strip():
            model: str | None = typed_model.strip()
        elif problem is None:  # a router may list "unknown": its first replica names the model
            model, problem = served_model(replicas[0] if replicas else endpoint)
        if problem:
            st.error(escape_markdown(problem))  # what the server said, as text
            return RemoteChoice(endpoint, None, api, remote.telemetry_interval_s, problem)
        st.caption(f"Watching model **{escape_markdown(model or '')}** at {escape_markdown(endpoint.root)}")
        if replicas:
            names = ", ".join(replica_name(replica.root) for replica in replicas)
            st.caption(f"Through the router to {len(replicas)} replicas: {escape_markdown(names)}")
    return RemoteChoice(endpoint, model, api, remote.telemetry_interval_s, None, replicas)


def _typed_lines(text: str) -> tuple[str, ...]:
    return tuple(line.strip() for line in text.splitlines() if line.strip())
