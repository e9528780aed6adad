"""Per-request recurrent state for hybrid models: convolution windows and SSM / linear-attention states.

Hybrid families (LFM2's short convolutions, Qwen3.5's and Qwen3-Next's gated delta-net, Mamba-2 and its hybrids)
keep, beside or instead of keys and values, a fixed-size state per sequence in some layers. transformers' own
classes read and write it through the cache (`get_conv_state`, `update_conv_state`, `get_recurrent_state`,
`update_recurrent_state`), so the engine keeps it here, one row of every state tensor per cache row: zeroed when a
request takes a row, moved with the request when rows move, dropped (recomputed) when it is preempted.

A packed step puts every row's new tokens in one sequence, which a convolution or a scan would run across
requests. So each layer that holds state (its *mixer*, found by a probe) is split per request: the decode rows (one
token each) run as one batch of one-token sequences over their own states, and each prompt chunk runs alone over
its row's state (a first chunk from zero, a later one from where the last left off), its padding left out. The
mixer is the model's own module, called with its own arguments; only the sequence it sees is cut.
"""

from __future__ import annotations

import inspect
import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel

# Layer kinds whose state is not keys and values per token (a "hybrid" layer has both).
RECURRENT_LAYER_TYPES = frozenset({"conv", "linear_attention", "mamba", "hybrid", "hybrid_sliding"})


@dataclass(frozen=True)
class LayerStateShapes:
    """One layer's state for one request: each conv and recurrent state's shape, without the batch dimension."""

    layer: int
    conv: tuple[tuple[int, ...], ...]
    recurrent: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class RecurrentLayout:
    """What a model keeps per request outside its KV blocks: the layers' state shapes, the modules that read and
    write them, and the name its forward takes the cache by (`past_key_values`, or Mamba's `cache_params`)."""

    layers: tuple[LayerStateShapes, ...]
    mixers: tuple[torch.nn.Module, ...]
    cache_kwarg: str
    dtype: torch.dtype
    # Whether a prompt chunk can start from a previous chunk's state in one call. Mamba-1's scan takes no initial
    # state (it restarts from zero), so there a later chunk runs one token at a time through the recurrent form.
    continues_chunks: bool = True

    def bytes_per_request(self) -> int:
        """Bytes of state one running request holds, every layer together."""
        count = sum(
            int(torch.Size(shape).numel()) for layer in self.layers for shape in (*layer.conv, *layer.recurrent)
        )
        return count * self.dtype.itemsize


_layouts: weakref.WeakKeyDictionary[torch.nn.Module, RecurrentLayout | None] = weakref.WeakKeyDictionary()
_split: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()  # mixers whose forward runs per request


def cache_kwarg(model: PreTrainedModel) -> str:
    """The keyword the model's forward takes its cache by."""
    parameters = inspect.signature(model.forward).parameters
    return "past_key_values" if "past_key_values" in parameters or "cache_params" not in parameters else "cache_params"


def recurrent_layout(model: PreTrainedModel) -> RecurrentLayout | None:
    """The model's per-request states, read from one probe forward of a single token through transformers' own
    cache (memoised); None for a model whose layers keep only keys and values."""
    if model in _layouts:
        return _layouts[model]
    layout = _probe(model) if _declares_states(model) else None
    _layouts[model] = layout
    return layout


def _declares_states(model: PreTrainedModel) -> bool:
    config = model.config.get_text_config()
    return any(kind in RECURRENT_LAYER_TYPES for kind in getattr(config, "layer_types", None) or ())


class _RecordingCache(DynamicCache):
    """transformers' cache, noting which module asks for each layer's state (the caller of `get_conv_state`)."""

    def __init__(self, config: Any) -> None:
        super().__init__(config=config)
        self.mixers: dict[int, torch.nn.Module] = {}

    def _note(self, layer_idx: int) -> None:
        caller = sys._getframe(2).f_locals.get("self")
        if isinstance(caller, torch.nn.Module):
            self.mixers.setdefault(layer_idx, caller)

    def get_conv_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        self._note(layer_idx)
        return super().get_conv_state(layer_idx, state_idx)

    def get_recurrent_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        self._note(layer_idx)
        return super().get_recurrent_state(layer_idx, state_idx)


def _probe(model: PreTrainedModel) -> RecurrentLayout:
    config = model.config.get_text_config()
    cache = _RecordingCache(config)
    kwarg = cache_kwarg(model)
    with torch.inference_mode():
        model(input_ids=torch.ones((1, 1), dtype=torch.long, device=model.device), use_cache=True, **{kwarg: cache})
    layers = []
    for index, layer in enumerate(cache.layers):
        conv = getattr(layer, "conv_states", {})
        recurrent = getattr(layer, "recurrent_states", {})
        conv_shapes = tuple(tuple(t.shape[1:]) for _, t in sorted(conv.items()) if t is not None)
        recurrent_shapes = tuple(tuple(t.shape[1:]) for _, t in sorted(recurrent.items()) if t is not None)
        if conv_shapes or recurrent_shapes:
            layers.append(LayerStateShapes(index, conv_shapes, recurrent_shapes))
    missing = sorted({shapes.layer for shapes in layers} - set(cache.mixers))
    if missing:
        raise ValueError(f"no module reads the state of layer(s) {missing} through the cache")
    mixers = tuple(cache.mixers[shapes.layer] for shapes in layers)
    return RecurrentLayout(tuple(layers), mixers, kwarg, model.dtype, _continues_chunks(model, kwarg))


def _continues_chunks(model: PreTrainedModel, kwarg: str) -> bool:
    """Whether the model's own classes, given a cache, carry a prompt's state from one chunk into the next: the
    last logits of 6 tokens in one forward against 3 and then 3 more (random weights disagree widely when not)."""
    config = model.config.get_text_config()
    ids = torch.arange(3, 9, device=model.device).remainder(config.vocab_size)[None]
    with torch.inference_mode():
        whole = model(input_ids=ids, use_cache=True, **{kwarg: DynamicCache(config=config)}).logits[0, -1]
        cache = DynamicCache(config=config)
        model(input_ids=ids[:, :3], use_cache=True, **{kwarg: cache})
        positions = torch.arange(3, 6, device=model.device)[None]
        split = model(input_ids=ids[:, 3:], position_ids=positions, use_cache=True, **{kwarg: cache}).logits[0, -1]
    return bool(torch.allclose(whole.float(), split.float(), rtol=1e-3, atol=1e-3 * float(whole.abs().max())))


@dataclass
class StateGroup:
    """Tokens of the packed step that one call of a mixer runs: their packed positions, the cache rows whose
    states they continue (one token per row for decode rows; one row for a prompt chunk), and whether the rows
    start from zero (a request's first chunk)."""

    tokens: torch.Tensor | slice  # positions in the packed sequence
    rows: torch.Tensor | slice  # cache rows, in the order of `tokens` for decode rows
    fresh: bool = False
    chunk: bool = False  # one row's tokens as one sequence (else one token per row, rows as the batch)


@dataclass
class StatePlan:
    """How this step's packed tokens split per request for the mixers; `None` groups: every row decodes one token,
    in row order (the compiled decode step: rows are read from the hidden states' batch)."""

    groups: list[StateGroup] | None = None


@dataclass
class RecurrentStates:
    """Every layer's states for every cache row: `conv[layer][i]` and `recurrent[layer][i]` are `[rows, *shape]`."""

    layout: RecurrentLayout
    capacity: int
    device: torch.device
    conv: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    recurrent: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    plan: StatePlan = field(default_factory=StatePlan)
    # The states the mixer now running sees, per layer: views (decode rows in order) or gathered copies.
    current: dict[int, tuple[list[torch.Tensor], list[torch.Tensor], bool]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        dtype, rows = self.layout.dtype, self.capacity
        for shapes in self.layout.layers:
            self.conv[shapes.layer] = [torch.zeros((rows, *s), dtype=dtype, device=self.device) for s in shapes.conv]
            self.recurrent[shapes.layer] = [
                torch.zeros((rows, *s), dtype=dtype, device=self.device) for s in shapes.recurrent
            ]

    def tensors(self) -> list[torch.Tensor]:
        return [t for layer in (*self.conv.values(), *self.recurrent.values()) for t in layer]

    @torch.inference_mode()
    def zero_row(self, row: int) -> None:
        """A new request's row starts from zero state."""
        for tensor in self.tensors():
            tensor[row].zero_()

    @torch.inference_mode()
    def move_row(self, source: int, target: int) -> None:
        """Rows moved (the last row into a freed one): its request's states go with it."""
        for tensor in self.tensors():
            tensor[target].copy_(tensor[source])

    def kept(self, rows: int) -> list[torch.Tensor]:
        """A copy of the first `rows` rows of every state, for `restore`: a compiled step that fails may have written
        them, and its eager rerun would advance them a second time (wrong answers, no error)."""
        return [tensor[:rows].clone() for tensor in self.tensors()]

    def restore(self, kept: list[torch.Tensor]) -> None:
        """Put back the rows `kept` copied."""
        for tensor, copy in zip(self.tensors(), kept, strict=True):
            tensor[: copy.shape[0]].copy_(copy)

    def select(self, layer: int, rows: torch.Tensor | slice, fresh: bool) -> None:
        """The rows the next mixer call of `layer` runs: views for a slice, copies for an index (see `commit`)."""
        if isinstance(rows, slice):
            conv = [t[rows] for t in self.conv[layer]]
            recurrent = [t[rows] for t in self.recurrent[layer]]
        else:
            conv = [t.index_select(0, rows) for t in self.conv[layer]]
            recurrent = [t.index_select(0, rows) for t in self.recurrent[layer]]
        self.current[layer] = (conv, recurrent, fresh)

    def commit(self, layer: int, rows: torch.Tensor | slice) -> None:
        """Write the copies a call updated back into their rows (views were updated in place)."""
        conv, recurrent, _ = self.current.pop(layer)
        if isinstance(rows, slice):
            return
        for store, value in zip(self.conv[layer] + self.recurrent[layer], conv + recurrent, strict=True):
            store.index_copy_(0, rows, value)

    # --- what transformers' cache methods answer for the layer now running ---------------------------------
    def get_conv(self, layer: int, index: int) -> torch.Tensor | None:
        conv, _, fresh = self.current[layer]
        return None if fresh else conv[index]

    def get_recurrent(self, layer: int, index: int) -> torch.Tensor | None:
        _, recurrent, fresh = self.current[layer]
        return None if fresh else recurrent[index]

    def update_conv(self, layer: int, index: int, new: torch.Tensor) -> torch.Tensor:
        """As transformers' `LinearAttentionLayer.update_conv_state`: a first chunk is left-padded to the kernel;
        a later one sees the window before it. Keeps the last kernel-size columns; returns what the conv reads."""
        conv, _, fresh = self.current[layer]
        window = conv[index]
        kernel = window.shape[-1]
        if fresh:
            full = torch.nn.functional.pad(new, (max(kernel - new.shape[-1], 0), 0)) if new.shape[-1] < kernel else new
        else:
            full = torch.cat([window, new.to(window.dtype)], dim=-1)
        window.copy_(full[..., -kernel:])
        return full

    def update_recurrent(self, layer: int, index: int, new: torch.Tensor) -> torch.Tensor:
        state = self.current[layer][1][index]
        state.copy_(new)
        return state

    def has_previous(self, layer: int) -> bool:
        current = self.current.get(layer)
        return current is not None and not current[2]


def _find_cache(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    for value in (*args, *kwargs.values()):
        if isinstance(getattr(value, "recurrent_states", None), RecurrentStates):
            return value
    return None


def split_mixers(layout: RecurrentLayout) -> None:
    """Make each mixer run per request whenever the engine's cache is passed (see the module's docstring); with any
    other cache, or none (`generate` on the same model), it runs as it always did. Idempotent."""
    for mixer in layout.mixers:
        if mixer in _split:
            continue
        mixer.forward = _split_forward(mixer, mixer.forward, layout.continues_chunks)
        _split.add(mixer)


def _split_forward(mixer: torch.nn.Module, original: Callable[..., Any], continues_chunks: bool) -> Callable[..., Any]:
    """`original` (the mixer's own forward) run per request when the engine's cache is passed; see `split_mixers`."""
    parameters = inspect.signature(original).parameters
    takes_mask = "attention_mask" in parameters
    name = "past_key_values" if "past_key_values" in parameters else "cache_params"
    layer = int(mixer.layer_idx)  # type: ignore[arg-type]

    def forward(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        cache = _find_cache(args, kwargs)
        if cache is None:
            return original(hidden_states, *args, **kwargs)
        states: RecurrentStates = cache.recurrent_states
        call_kwargs: dict[str, Any] = {name: cache}
        if takes_mask:
            call_kwargs["attention_mask"] = None  # a request's own tokens hold no padding: it is cut out below
        groups = states.plan.groups
        if groups is None:  # every row decodes, in row order: rows are the batch, one token each
            # Gathered by index, not sliced: a slice's bounds would be specialised on when the step is compiled.
            rows = torch.arange(hidden_states.shape[1], device=hidden_states.device)
            states.select(layer, rows, fresh=False)
            output = original(hidden_states.transpose(0, 1), **call_kwargs)
            states.commit(layer, rows)
            return output.transpose(0, 1)
        output = hidden_states.new_zeros(hidden_states.shape)
        for group in groups:
            if group.chunk and not group.fresh and not continues_chunks:
                assert isinstance(group.tokens, slice) and isinstance(group.rows, slice)
                for token in range(group.tokens.start, group.tokens.stop):  # the recurrent form, a token at a time
                    states.select(layer, group.rows, fresh=False)
                    output[:, token : token + 1] = original(hidden_states[:, token : token + 1], **call_kwargs)
                    states.commit(layer, group.rows)
                continue
            states.select(layer, group.rows, group.fresh)
            if group.chunk:
                output[:, group.tokens] = original(hidden_states[:, group.tokens], **call_kwargs)
            else:
                one_each = hidden_states[0, group.tokens].unsqueeze(1)
                output[0, group.tokens] = original(one_each, **call_kwargs)[:, 0]
            states.commit(layer, group.rows)
        return output

    return forward
