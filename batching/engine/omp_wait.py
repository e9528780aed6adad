"""What torch's idle OpenMP threads do between ops, in words for a report: libgomp's default unless told.

libgomp (torch's OpenMP runtime) lets a thread that finished its part of an op spin for a while before it sleeps,
so the next op finds it awake. The engine leaves that as it is. An earlier version set `OMP_WAIT_POLICY=PASSIVE`
(sleep at once), measured under a load average of 8, where a spinning thread takes a core from one with work: the
embedded model's 8-row eager step at 2 threads took 243-289 ms spinning, 24-35 ms passive. On cores nobody else
uses the same choice was ruinous (the 2-vCPU AMD EPYC at load 0.1, 2026-11-27, seed-lab compiled at 2 threads):
waking a sleeping thread costs more than a small kernel, so 669 tok/s passive against 3,071 spinning and 2,028 on
one thread. The thread probe (`threads.pick_threads`) runs under the policy the steps will run under, so on a loaded
machine it measures the spin's cost and keeps one thread (one thread opens no parallel region: no spin, no wait).
"""

from __future__ import annotations

import os

ENV = "OMP_WAIT_POLICY"


def wait_policy_state() -> str:
    """What torch's idle threads do, in words, for a report's machine line."""
    policy = os.environ.get(ENV, "")
    return policy.lower() if policy else "libgomp's default (spin, then sleep)"
