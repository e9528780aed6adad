"""A loaded transformers model as a GGUF file for llama.cpp (F32, or its layers' linear weights in Q4_0), written
with the `gguf` package and cached on disk.

Only what the llama.cpp peer needs: the Llama, Qwen2 and GPT-2 families with a byte-level BPE tokenizer (the
embedded model and the test models). The tensors are the model's own float32 weights, renamed by gguf's tensor
map and changed only where llama.cpp's own converter changes them: Llama's query and key rows reordered (llama.cpp
rotates adjacent pairs, transformers the two halves), GPT-2's Conv1D weights transposed. Prompts reach the server
as token ids, so the vocabulary only has to match id for id. Anything else is refused with one line naming what is
not supported.

A GPTQ model is written from its own 4-bit grid: each quantised layer's weights unpacked from the folder's
`qweight`/`qzeros`/`scales` to float32 (the values its kernel multiplies by), then stored as F32 or as llama.cpp's
Q4_0, so llama.cpp runs the same 4-bit model ours does (Q4_0's groups of 32 hold a group-128 grid within a rounding).
Embeddings, norms and the output projection stay F32 in both, as ours keeps them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

# Bumped whenever the file written changes, so a cached file from an older converter is not reused.
CONVERTER_VERSION = "2"
WEIGHT_FORMATS = ("f32", "q4_0")  # how the layers' linear weights are stored; everything else is F32
_LINEAR = re.compile(r"^model\.layers\.\d+\.(self_attn|mlp)\.\w+_proj\.weight$")
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "gpt2": "gpt2"}  # transformers model_type -> GGUF architecture
_GPT2_CONV1D = (".c_attn.weight", ".c_proj.weight", ".c_fc.weight")  # stored [in, out]: llama.cpp wants [out, in]
INSTALL_HINT = "pip install -r requirements-llamacpp.txt"


class GGUFConversionError(Exception):
    """The model cannot be converted (architecture, tokenizer or a missing package): one line saying which."""


def default_cache_dir() -> Path:
    """Where converted files live: $BATCHSCOPE_GGUF_CACHE, else the user's cache folder (never the repository)."""
    given = os.environ.get("BATCHSCOPE_GGUF_CACHE")
    if given:
        return Path(given)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "batchscope" / "gguf"


def check_convertible(model: PreTrainedModel) -> str:
    """The GGUF architecture of `model`, or GGUFConversionError naming its type and the supported ones."""
    model_type = model.config.model_type
    if model_type not in ARCHITECTURES:
        raise GGUFConversionError(
            f"model type {model_type!r} cannot be converted to GGUF here: supported are {', '.join(ARCHITECTURES)}"
        )
    rope = getattr(model.config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise GGUFConversionError(f"rope_type {rope['rope_type']!r} is not supported by the GGUF export: only default")
    activation = getattr(model.config, "activation_function", "gelu_new")
    if model_type == "gpt2" and activation not in ("gelu_new", "gelu_pytorch_tanh"):
        raise GGUFConversionError(f"GPT-2 activation {activation!r} is not supported by the GGUF export: only gelu_new")
    return ARCHITECTURES[model_type]


def convert(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, cache_dir: Path | None = None, weights: str = "f32"
) -> Path:
    """The GGUF file of `model` and `tokenizer`, its layers' linear weights as `weights` (f32 or q4_0): taken from
    the cache when an identical model was converted the same way."""
    if weights not in WEIGHT_FORMATS:
        raise GGUFConversionError(f"weights={weights!r} is not a GGUF format here: one of {', '.join(WEIGHT_FORMATS)}")
    arch = check_convertible(model)
    vocab = _tokenizer_json(tokenizer)
    tensors = float_tensors(model)
    digest = _digest(f"{model.config.to_json_string()}\n{weights}", json.dumps(vocab, sort_keys=True), tensors)
    folder = cache_dir or default_cache_dir()
    path = folder / f"{arch}-{digest[:20]}.{weights}.gguf"
    if path.is_file():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.partial")
    try:
        _write(partial, arch, model, tokenizer, vocab, tensors, weights)
        partial.replace(path)  # atomic: a reader never sees half a file
    finally:
        partial.unlink(missing_ok=True)
    return path


def float_tensors(model: PreTrainedModel) -> dict[str, torch.Tensor]:
    """The model's tensors in float32, by their transformers names; a GPTQ model's quantised layers as the float
    weights their 4-bit grid holds (read from the folder it was loaded from)."""
    tensors = {name: tensor.detach().to("cpu", torch.float32) for name, tensor in model.state_dict().items()}
    if getattr(model.config, "quantization_config", None) is None:
        return tensors
    from safetensors.torch import load_file

    folder = Path(model.config._name_or_path)
    stored: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        stored.update(load_file(path))
    bits = _gptq_bits(model)
    plain = {name: tensor for name, tensor in tensors.items() if not name.endswith(_GPTQ_PARTS)}
    for name in [name for name in stored if name.endswith(".qweight")]:
        prefix = name.removesuffix(".qweight")
        plain[f"{prefix}.weight"] = gptq_dequantize(
            stored[name], stored[f"{prefix}.qzeros"], stored[f"{prefix}.scales"], stored[f"{prefix}.g_idx"], bits
        )
        if f"{prefix}.bias" in stored:
            plain[f"{prefix}.bias"] = stored[f"{prefix}.bias"].to(torch.float32)
    return plain


_GPTQ_PARTS = (".qweight", ".qzeros", ".scales", ".g_idx", ".wf_unsqueeze_zero", ".wf_unsqueeze_neg_one")


def _gptq_bits(model: PreTrainedModel) -> int:
    quantization = model.config.quantization_config
    settings = quantization if isinstance(quantization, dict) else quantization.to_dict()
    if str(settings.get("quant_method")).lower().removeprefix("quantizationmethod.") != "gptq" or settings.get(
        "bits"
    ) not in (4, 8):
        raise GGUFConversionError(f"only 4- and 8-bit GPTQ models convert to GGUF here, not {settings}")
    if str(settings.get("checkpoint_format", settings.get("format", "gptq"))) != "gptq":
        raise GGUFConversionError("only GPTQ's own checkpoint format (v1) converts to GGUF here")
    return int(settings["bits"])


def gptq_dequantize(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor, bits: int
) -> torch.Tensor:
    """A GPTQ (v1 checkpoint) layer's weights as float32 [out, in]: w = scale * (q - (zero + 1)), each input row in
    the group `g_idx` names, codes packed `32 // bits` to an int32, lowest bits first (inputs along qweight's rows,
    outputs along qzeros' columns)."""
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    mask = (1 << bits) - 1
    codes = ((qweight.unsqueeze(1) >> shifts.view(1, -1, 1)) & mask).reshape(-1, qweight.shape[1])  # [in, out]
    zeros = ((qzeros.unsqueeze(2) >> shifts.view(1, 1, -1)) & mask).reshape(qzeros.shape[0], -1)  # [groups, out]
    zeros = zeros[:, : scales.shape[1]] + 1
    groups = g_idx.long()
    weight = (codes.to(torch.float32) - zeros[groups].to(torch.float32)) * scales[groups].to(torch.float32)
    return weight.T.contiguous()


def _digest(config: str, vocab: str, tensors: dict[str, torch.Tensor]) -> str:
    sha = hashlib.sha256(f"{CONVERTER_VERSION}\n{config}\n{vocab}".encode())
    for name in sorted(tensors):
        sha.update(name.encode())
        sha.update(tensors[name].contiguous().numpy().tobytes())
    return sha.hexdigest()


def _tokenizer_json(tokenizer: PreTrainedTokenizerBase) -> dict[str, Any]:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise GGUFConversionError(f"tokenizer {type(tokenizer).__name__} has no tokenizers backend: need a fast one")
    data = json.loads(backend.to_str())
    kind = data["model"]["type"]
    byte_level = (data.get("pre_tokenizer") or {}).get("type") == "ByteLevel" or "ByteLevel" in json.dumps(
        data.get("pre_tokenizer")
    )
    if kind != "BPE" or not byte_level:
        raise GGUFConversionError(f"tokenizer model {kind!r} is not supported by the GGUF export: only byte-level BPE")
    return dict(data)


def _import_gguf() -> Any:
    try:
        import gguf
    except ImportError:
        raise GGUFConversionError(f"the gguf package is not installed ({INSTALL_HINT})") from None
    return gguf


def _write(
    path: Path,
    arch: str,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    vocab: dict[str, Any],
    tensors: dict[str, torch.Tensor],
    weights: str,
) -> None:
    gguf = _import_gguf()
    config = model.config
    writer = gguf.GGUFWriter(path, arch)
    writer.add_name(getattr(config, "_name_or_path", "") or arch)
    if arch == "gpt2":
        _gpt2_hyperparameters(writer, config)
    else:
        _llama_hyperparameters(writer, config)
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0 if weights == "q4_0" else gguf.LlamaFileType.ALL_F32)
    _add_vocab(writer, gguf, vocab, tokenizer, config.vocab_size)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], config.num_hidden_layers)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    for name, tensor in tensors.items():
        if tied and name == "lm_head.weight":
            continue  # llama.cpp reads the output projection from the embedding when the file has none
        new_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if new_name is None:
            raise GGUFConversionError(f"tensor {name!r} has no GGUF name for architecture {arch}")
        if arch == "llama" and re.search(r"\.(q|k)_proj\.(weight|bias)$", name):
            heads = config.num_attention_heads if ".q_proj." in name else config.num_key_value_heads
            tensor = _rotate_pairs(tensor, heads)
        elif arch == "gpt2" and name.endswith(_GPT2_CONV1D):
            tensor = tensor.T
        data = np.ascontiguousarray(tensor.numpy(), dtype=np.float32)
        if weights == "q4_0" and _LINEAR.match(name) and data.shape[-1] % 32 == 0:
            q4 = gguf.GGMLQuantizationType.Q4_0
            writer.add_tensor(new_name, gguf.quants.quantize(data, q4), raw_dtype=q4)
        else:
            writer.add_tensor(new_name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _llama_hyperparameters(writer: Any, config: Any) -> None:
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    rope = getattr(config, "rope_parameters", None) or {}
    writer.add_rope_freq_base(float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))


def _gpt2_hyperparameters(writer: Any, config: Any) -> None:
    writer.add_context_length(config.n_positions)
    writer.add_embedding_length(config.n_embd)
    writer.add_block_count(config.n_layer)
    writer.add_feed_forward_length(config.n_inner or 4 * config.n_embd)
    writer.add_head_count(config.n_head)
    writer.add_layer_norm_eps(float(config.layer_norm_epsilon))


def _rotate_pairs(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Reorder each head's rows from transformers' half-split rotary layout to llama.cpp's interleaved pairs."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _add_vocab(writer: Any, gguf: Any, data: dict[str, Any], tokenizer: PreTrainedTokenizerBase, size: int) -> None:
    """Tokens id for id (byte-level strings, as llama.cpp's gpt2 tokenizer expects), their types, and the merges."""
    tokens: dict[int, tuple[str, int]] = {
        index: (text, gguf.TokenType.NORMAL) for text, index in data["model"]["vocab"].items()
    }
    for added in data.get("added_tokens", []):
        kind = gguf.TokenType.CONTROL if added.get("special") else gguf.TokenType.USER_DEFINED
        tokens[added["id"]] = (added["content"], kind)
    # Tokens past the model's vocab_size (a tokenizer class may add one) have no embedding: the model can neither
    # read nor produce them, so the file leaves them out, as the engine's own checks refuse them.
    texts, types = [], []
    for index in range(size):
        text, kind = tokens.get(index, (f"[PAD{index}]", gguf.TokenType.UNUSED))
        texts.append(text)
        types.append(kind)
    merges = [merge if isinstance(merge, str) else " ".join(merge) for merge in data["model"].get("merges", [])]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(texts)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    for setter, value in (
        (writer.add_bos_token_id, tokenizer.bos_token_id),
        (writer.add_eos_token_id, tokenizer.eos_token_id),
        (writer.add_pad_token_id, tokenizer.pad_token_id),
    ):
        if value is not None and value < size:
            setter(int(value))
    writer.add_add_bos_token(False)  # prompts are sent as token ids, already as the engine built them
