"""The page's tests' fixtures (the page runs in this process under AppTest)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def _keep_torch_threads() -> Iterator[None]:
    """The app runs a small model on one torch thread (process-wide); give other test modules theirs back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
