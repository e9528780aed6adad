"""Which script run of a tab follows a live run: the newest one.

Streamlit's fast reruns (its default) start a new script run on a click while the old one is still going: the old
one stops only at its next Streamlit call. Both would then poll the same engine handle and change the same run from
two threads: one could take events the other never draws, or note an answer as drawn that it never drew (a cursor
left on a finished answer). So a script run takes the run's baton before it draws the run, and a loop folds events
in only while it holds it; an older loop finds it taken and stops.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Baton:
    """Held by the newest follower of a run; checked, under one lock, around every poll and fold."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holder: Follower | None = None

    def take(self) -> Follower:
        """Become the run's follower. Waits for the current holder's fold to end."""
        follower = Follower(self)
        with self._lock:
            self._holder = follower
        return follower


class Follower:
    """One script run's claim on a run's baton (`Baton.take`)."""

    def __init__(self, baton: Baton) -> None:
        self._baton = baton

    @contextmanager
    def following(self) -> Iterator[bool]:
        """Whether this is still the run's follower, kept true for the whole block (no one can take it meanwhile)."""
        with self._baton._lock:
            yield self._baton._holder is self
