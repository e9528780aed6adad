"""The KV memory benchmark script, on a tiny model and a small workload: its runs share one budget, its table reads."""

from __future__ import annotations

from pathlib import Path

import torch

from batching.bench.memory import FULL_SLOTS, Config, configs, format_tables, run_config
from batching.bench.options import load
from batching.bench.race import race_args
from config.settings import load_settings
from tests.bench.test_race import _json_workload


def test_every_run_has_the_kv_memory_of_eight_full_slots_and_the_paged_ones_have_more_slots() -> None:
    plan = configs(budget=8192, slots=32, random_requests=64)
    assert [workload for workload, _ in plan] == ["seed-blog", "random 64", "customer-support"]
    for _, runs in plan:
        for run in runs:
            flags = list(run.flags)
            assert flags[flags.index("--kv-cache-tokens") + 1] == "8192"
    slots = [run.flags[run.flags.index("--batch-size") + 1] for run in plan[0][1]]
    assert slots == [str(FULL_SLOTS), str(FULL_SLOTS), "32", "32"]
    caching = ["--no-prefix-caching" not in run.flags for run in plan[2][1]]
    assert caching == [True, False, True, False]  # on and off, at once then spread out


def test_runs_report_the_pool_and_the_table_says_how_much_prefix_caching_cut_ttft(
    tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    workload = str(_json_workload(tmp_path))
    common = ["--model", str(tiny_model_dirs["llama"]), "--device", "cpu", "--dtype", "float32", "--ignore-eos"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        loaded = load(race_args(["--workload", workload, *common]), load_settings())
        flags = ("--workload", workload, "--batch-size", "3", "--kv-cache-tokens", "640")
        on = run_config(Config("continuous, at once, on", "continuous", flags), loaded, common, repeat=1)
        off_flags = (*flags, "--no-prefix-caching")
        off = run_config(Config("continuous, at once, off", "continuous", off_flags), loaded, common, repeat=1)
    finally:
        torch.set_num_threads(threads)
    assert on["memory"]["pool_positions"] == 640 and on["slots"] == 3
    assert on["memory"]["prefix_hits"] > 0 == off["memory"]["prefix_hits"]
    budget = {"positions": 640, "blocks": 40, "block_size": 16}
    workloads = {"customer-support": [on, off]}
    result = {"model": "tiny", "threads": 1, "repeat": 1, "budget": budget, "workloads": workloads}
    table = format_tables(result)
    assert "640 positions (40 blocks of 16)" in table
    assert "prefix caching, at once: TTFT p50" in table and " ms off (" in table
