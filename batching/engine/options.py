"""The shape of a batcher: slots, the per-step token budget, admission order, the longest sequences, compiled steps,
and the KV pool's block size and budget. Checked here; what the model adds (its context, its bytes per token) is
the pool geometry's (`geometry`)."""

from __future__ import annotations

from dataclasses import dataclass

from batching.engine.blocks import DEFAULT_BLOCK_SIZE
from batching.engine.scheduler import check_admission, check_policy
from config.choices import BLOCK_SIZES, FCFS, PREEMPT


@dataclass(frozen=True)
class BatcherOptions:
    """The shape of a batcher: slots, per-step token budget, admission order, and the longest sequences.

    The engine checks only what it needs to run; upper bounds a person may choose are the settings' business.
    """

    max_batch_size: int = 8
    max_batched_tokens: int = 512
    policy: str = FCFS
    admission: str = PREEMPT  # continuous batching's use of KV blocks: "preempt" (vLLM) or "reserve" (see ADMISSIONS)
    max_seq_len: int = 2048
    max_prompt_tokens: int = 512
    step_detail: bool = True  # each StepEvent lists its rows (the step inspector's data); off for lean benchmarks
    compile_steps: bool = False  # decode steps through a compiled graph once it is ready (see engine.compiled)
    compile_autotune: bool = True  # the compiler picks its matrix kernels by timing them (a longer first compile)
    compile_prompt_steps: bool = False  # with compile_steps: steps with prompt chunks through a graph of their own
    cuda_graphs: bool = True  # with compile_steps on a GPU: decode steps replayed from CUDA graphs (engine.cuda_graphs)
    block_size: int = DEFAULT_BLOCK_SIZE  # KV positions per block
    # The KV pool: at most one of these (none: every slot's whole context, what a cache of full-length slots holds).
    kv_blocks: int | None = None
    kv_cache_tokens: int | None = None  # positions, rounded down to whole blocks
    kv_cache_mb: float | None = None  # MiB of keys and values, by the model's size per token
    prefix_caching: bool = True  # continuous batching reuses cached blocks of equal prefixes (static never does)

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size={self.max_batch_size} is not allowed: must be >= 1")
        if self.max_batched_tokens <= self.max_batch_size:
            raise ValueError(
                f"max_batched_tokens={self.max_batched_tokens} is not allowed: must exceed max_batch_size="
                f"{self.max_batch_size}, so prompts still get prefilled while every slot decodes"
            )
        check_policy(self.policy)
        check_admission(self.admission)
        if self.block_size not in BLOCK_SIZES:
            raise ValueError(f"block_size={self.block_size} is not allowed: choose one of {BLOCK_SIZES}")
        given = {"kv_blocks": self.kv_blocks, "kv_cache_tokens": self.kv_cache_tokens, "kv_cache_mb": self.kv_cache_mb}
        chosen = {name: value for name, value in given.items() if value is not None}
        if len(chosen) > 1:
            raise ValueError(f"{' and '.join(chosen)} are both set: give the KV memory one way")
        least = {"kv_blocks": 1, "kv_cache_tokens": self.block_size, "kv_cache_mb": 0}
        for name, value in chosen.items():
            if value < least[name] or value <= 0:
                raise ValueError(f"{name}={value} is not allowed: the pool must hold at least one block")
