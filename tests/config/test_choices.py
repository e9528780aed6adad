"""The names of the engine's choices: the settings and the page offer exactly what the engine runs."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.common.sidebar import POLICY_LABELS
from app.race.knobs import ADMISSION_LABELS, BLOCK_SIZE_CHOICES
from batching.engine.options import BatcherOptions
from batching.engine.scheduler import ADMISSIONS, POLICIES
from config.choices import ADMISSION_NAMES, BLOCK_SIZES, POLICY_NAMES
from config.settings import BatchingSettings


def test_the_settings_and_the_sidebar_offer_exactly_the_schedulers_policies() -> None:
    assert tuple(POLICIES) == POLICY_NAMES
    assert tuple(POLICY_LABELS) == tuple(POLICIES)
    for policy in POLICIES:
        assert BatchingSettings(policy=policy).policy == policy
    with pytest.raises(ValidationError, match="should be 'fcfs', 'shortest-first' or 'longest-first'"):
        BatchingSettings(policy="lifo")


def test_the_settings_and_the_sidebar_offer_exactly_the_schedulers_admissions() -> None:
    assert tuple(ADMISSIONS) == ADMISSION_NAMES
    assert tuple(ADMISSION_LABELS) == tuple(ADMISSIONS)
    for admission in ADMISSIONS:
        assert BatchingSettings(admission=admission).admission == admission
    with pytest.raises(ValidationError, match="should be 'preempt' or 'reserve'"):
        BatchingSettings(admission="evict")


def test_every_block_size_the_settings_or_the_sidebar_offer_the_engine_takes() -> None:
    assert set(BLOCK_SIZE_CHOICES) <= set(BLOCK_SIZES)
    for size in BLOCK_SIZES:
        assert BatchingSettings(block_size=size).block_size == BatcherOptions(block_size=size).block_size
    with pytest.raises(ValidationError, match="should be 1, 2, 4, "):
        BatchingSettings(block_size=3)
    with pytest.raises(ValueError, match="block_size=3 is not allowed"):
        BatcherOptions(block_size=3)
