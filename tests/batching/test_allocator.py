"""The allocator the entry points run on: TCMalloc preloaded by starting again once, only for `python -m` of an entry
point, never twice, never when turned off or not installed; and what a process says it runs on."""

from __future__ import annotations

from pathlib import Path

import pytest

from batching.allocator import ENV, allocator_state, find_tcmalloc, relaunch_env, started_as_entry_point


def test_only_the_entry_points_started_with_dash_m_start_again() -> None:
    assert started_as_entry_point(["/usr/bin/python3", "-m", "batching.serve", "--port", "8000"])
    assert started_as_entry_point(["python", "-X", "importtime", "-m", "batching.bench", "--workload", "random"])
    assert not started_as_entry_point(["python", "-m", "pytest", "-m", "batching.serve"])  # -m's first value counts
    assert not started_as_entry_point(["python", "-m", "batching.service", "3", "4"])  # the fresh engine: inherits
    assert not started_as_entry_point(["streamlit", "run", "streamlit_app.py"])
    assert not started_as_entry_point(["python", "-m"])


def test_the_library_is_preloaded_once_before_what_was_preloaded_and_never_when_turned_off(tmp_path: Path) -> None:
    library = tmp_path / "libtcmalloc_minimal.so.4"
    env = relaunch_env({"PATH": "/bin", "LD_PRELOAD": "/opt/other.so"}, library)
    assert env == {"PATH": "/bin", "LD_PRELOAD": f"{library} /opt/other.so"}
    assert relaunch_env(env, library) is None  # started again already: no loop
    assert relaunch_env({"PATH": "/bin"}, None) is None  # not installed: glibc's malloc
    assert relaunch_env({ENV: "system"}, library) is None
    assert relaunch_env({ENV: "SYSTEM"}, library) is None
    assert relaunch_env({ENV: "tcmalloc"}, library) == {ENV: "tcmalloc", "LD_PRELOAD": str(library)}


def test_the_library_is_found_by_its_debian_names(tmp_path: Path) -> None:
    assert find_tcmalloc([str(tmp_path)]) is None
    (tmp_path / "libtcmalloc.so.4").write_bytes(b"")
    assert find_tcmalloc([str(tmp_path / "none"), str(tmp_path)]) == tmp_path / "libtcmalloc.so.4"
    (tmp_path / "libtcmalloc_minimal.so.4").write_bytes(b"")  # the minimal one first: no heap profiler
    assert find_tcmalloc([str(tmp_path)]) == tmp_path / "libtcmalloc_minimal.so.4"


def test_a_process_says_which_malloc_its_memory_map_holds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r-xp 00000000 08:01 123 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
        "7f02-7f03 r-xp 00000000 08:01 456 /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4.5.10\n"
    )
    assert allocator_state(maps) == "TCMalloc (/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4.5.10)"
    maps.write_text("7f00-7f01 r-xp 00000000 08:01 123 /usr/lib/x86_64-linux-gnu/libc.so.6\n")
    monkeypatch.setenv(ENV, "system")
    assert allocator_state(maps) == f"glibc's malloc ({ENV}=system)"
    assert allocator_state(tmp_path / "missing") == "unknown"
