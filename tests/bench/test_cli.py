"""The bench's one command line: a subcommand per tool, the shared options defined once and read alike by each, no
subcommand (or the race's old flags) one clear line naming them, and no second entry point in the bench."""

from __future__ import annotations

import argparse
import ast

import pytest

from batching.bench import cli, options
from tests.helpers import ROOT


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_tool_is_a_subcommand_with_its_own_flags_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    parsers = _subparsers()
    assert list(parsers) == list(cli.NAMES)
    assert {"race", "sweep", "steady", "serve-peer", "memory", "interference", "shapes"} <= set(parsers)
    assert {"race-check", "cold-start", "gpu-check"} <= set(parsers)
    for name in cli.NAMES:
        with pytest.raises(SystemExit) as done:
            cli.main([name, "--help"])
        assert done.value.code == 0
        assert capsys.readouterr().out.startswith(f"usage: python -m batching.bench {name} ")


def test_a_shared_option_reads_the_same_in_every_subcommand_that_takes_it() -> None:
    taken: dict[str, list[str]] = {}
    for name, parser in _subparsers().items():
        for action in parser._actions:
            for flag in action.option_strings:
                if flag in options.SHARED:
                    shared = options.SHARED[flag]
                    assert (action.help or "").startswith(shared.get("help", flag[2:])), (name, flag, action.help)
                    assert action.type == shared.get("type", action.type) and action.choices == shared.get("choices")
                    taken.setdefault(flag, []).append(name)
    assert {"race", "sweep", "memory", "interference", "steady", "serve-peer"} <= set(taken["--model"])
    assert {"race", "sweep", "memory", "interference"} <= set(taken["--threads"])
    assert {"race", "sweep", "steady"} <= set(taken["--workload"])


def test_without_a_subcommand_it_lists_them_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    err = capsys.readouterr().err
    assert "race" in err and "sweep" in err and "gpu-check" in err  # the list, from the help
    assert err.splitlines()[-1].startswith("bench: error: no subcommand given: choose one of race, sweep, ")


def test_the_races_old_flags_without_its_subcommand_say_what_to_type(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--workload", "seed-lab"]) == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith("bench: error: '--workload' is not a subcommand") and "the race is `race` now" in last


def test_a_bad_flag_is_one_line_naming_the_subcommand_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["sweep", "--no-such-flag"]) == 2
    assert capsys.readouterr().err == "bench sweep: error: unrecognized arguments: --no-such-flag\n"


def test_the_bench_has_one_entry_point() -> None:
    """Only `python -m batching.bench` runs the tools; llama.cpp's server stand-in is a program of its own, run by
    path (it mimics the `llama-server` binary and imports nothing of ours)."""
    entry_points = []
    for path in sorted((ROOT / "batching" / "bench").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            main = isinstance(node, ast.FunctionDef) and node.name == "main"
            if main or (
                isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id == "__name__"
            ):
                entry_points.append(path.relative_to(ROOT).as_posix())
    assert sorted(set(entry_points)) == ["batching/bench/cli.py", "batching/bench/peers/llamacpp_server.py"]
