"""The engine core: requests and their parameters, a scheduler per policy family, the slot KV cache, the model
runner with packed attention, sampling, detokenising, and the batcher that steps them. It imports nothing else of
Batchscope, and nothing of Streamlit, HTTP or the benchmark.
"""

from batching.engine.huge_pages import huge_pages_state, request_huge_pages

request_huge_pages()  # before the modules below import torch: its allocator reads the setting once

from batching.engine.batcher import MODES, Batcher, eos_token_ids
from batching.engine.builder import RequestBuilder
from batching.engine.events import Event, FinishedEvent, StepEvent, TokenEvent
from batching.engine.geometry import PoolGeometry
from batching.engine.model_support import model_context_length
from batching.engine.options import BatcherOptions
from batching.engine.params import RequestParams, SamplingParams
from batching.engine.request import FinishReason, Request, RequestState
from batching.engine.scheduler import POLICIES

__all__ = [
    "MODES",
    "POLICIES",
    "Batcher",
    "BatcherOptions",
    "Event",
    "FinishReason",
    "FinishedEvent",
    "PoolGeometry",
    "Request",
    "RequestBuilder",
    "RequestParams",
    "RequestState",
    "SamplingParams",
    "StepEvent",
    "TokenEvent",
    "eos_token_ids",
    "huge_pages_state",
    "model_context_length",
]
