"""What torch's idle OpenMP threads do between ops: sleep at once (`OMP_WAIT_POLICY=PASSIVE`), not spin first.

libgomp (torch's OpenMP runtime) lets a thread that finished its part of an op spin for a while before it sleeps,
so the next op finds it awake. On cores shared with other work that spin is paid for twice: it takes a core from a
thread that has work (ours or another process's), and an op cannot end until every one of its threads has run, so
a step waits on threads the OS has not scheduled. Measured on the 2-vCPU AMD EPYC under a load average of 8
(2026-11-27, the embedded model's 8-row eager decode step, median of 3, three alternating runs each):
2 threads 243-289 ms with libgomp's default spin, 24-35 ms passive, 150-180 ms with `GOMP_SPINCOUNT=10000`, and
635-1,217 ms at 100,000 (`ACTIVE`, spinning for good, was as slow and slowed one thread too); one thread 16-25 ms
whatever the policy (it opens no parallel region). libgomp reads the variable once, when torch loads it: so the
engine package sets it before any of its modules imports torch, as it sets huge pages, unless the environment
already says. Peers started as processes of their own (llama.cpp, vLLM) get the environment without it
(`peer_environment`): they run with their own runtime's default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

ENV = "OMP_WAIT_POLICY"
_state = {"set_here": False}


def request_passive_wait() -> None:
    """Idle OpenMP threads sleep at once, unless the environment already says (call before importing torch)."""
    if ENV not in os.environ:
        os.environ[ENV] = "PASSIVE"
        _state["set_here"] = True


def peer_environment(environment: Mapping[str, str]) -> dict[str, str]:
    """`environment` less the wait policy this process set for itself (a user's own setting stays)."""
    if not _state["set_here"]:
        return dict(environment)
    return {key: value for key, value in environment.items() if key != ENV}


def wait_policy_state() -> str:
    """What torch's idle threads do, in words, for a report's machine line."""
    policy = os.environ.get(ENV, "")
    return policy.lower() if policy else "libgomp's default (spin, then sleep)"
