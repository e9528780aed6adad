"""Helpers of the engine process's tests: a fault planted inside the engine process."""

from __future__ import annotations

FAILING_SEED = 666


def fail_sampling_with_seed_666() -> None:
    """An engine-process initializer (runs in that process): sampling raises for requests seeded 666, so one
    request fails inside the engine while the others in its batch go on."""
    import batching.engine.sampling as sampling

    real_choose = sampling.RequestSampler.choose

    def choose(self, logits, history):
        if self.params.seed == FAILING_SEED:
            raise ValueError("tokenizer exploded")
        return real_choose(self, logits, history)

    sampling.RequestSampler.choose = choose


HANGING_SEED = 777


def hang_sampling_with_seed_777() -> None:
    """An engine-process initializer: sampling a request seeded 777 never returns (a hung step, while the
    process's heartbeat thread goes on)."""
    import threading

    import batching.engine.sampling as sampling

    real_choose = sampling.RequestSampler.choose

    def choose(self, logits, history):
        if self.params.seed == HANGING_SEED:
            threading.Event().wait()
        return real_choose(self, logits, history)

    sampling.RequestSampler.choose = choose
