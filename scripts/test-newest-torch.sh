#!/usr/bin/env bash
# The engine's core tests (every family, both schedules, chunked prefill, preemption, compiled steps, the door to
# torch's internals) on the newest torch the registry serves, in a virtual environment of its own: run it before a
# change that touches torch lands, so that moving the pin (requirements.txt) stays a one-line change. On a torch the
# door was not checked on, compiled steps take the public route (batching/engine/torch_gate.py): these tests say
# whether that route serves token for token there.
#
#   scripts/test-newest-torch.sh [pytest arguments]      (default: the core test modules below)
#
# BATCHSCOPE_NEWEST_TORCH (default 2.14.1: the newest here, a CUDA build of several GB that runs on a CPU),
# BATCHSCOPE_NEWEST_TORCH_VENV (default ~/.cache/batchscope/newest-torch) and PYTHON (the interpreter the environment
# is made from; default python3) change where and what. A second run reuses the environment: seconds to check it.
set -euo pipefail
cd "$(dirname "$0")/.."
torch_version="${BATCHSCOPE_NEWEST_TORCH:-2.14.1}"
venv="${BATCHSCOPE_NEWEST_TORCH_VENV:-$HOME/.cache/batchscope/newest-torch}"
python="${PYTHON:-python3}"
core=(
  tests/engine/test_torch_door.py
  tests/engine/test_families.py
  tests/engine/test_equivalence.py
  tests/engine/test_engine.py
  tests/engine/test_scheduler.py
  tests/engine/test_compiled.py
)

if [ ! -x "$venv/bin/python" ]; then
  echo "making $venv"
  "$python" -m venv "$venv"
fi
# Everything as requirements.txt pins it but torch, and the test runner's own packages as requirements-dev.txt pins them.
requirements="$venv/requirements-newest-torch.txt"
{
  echo "torch==$torch_version"
  grep -v -E '^torch==' requirements.txt
  grep -E '^(pytest|hypothesis|pytest-xdist)==' requirements-dev.txt
} >"$requirements"
echo "installing torch $torch_version and the pinned requirements into $venv (several GB the first time)"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet -r "$requirements"
installed="$("$venv/bin/python" -c 'import torch; print(torch.__version__)')"
echo "torch $installed: $("$venv/bin/python" -c 'from batching.engine.torch_gate import door_state; print(door_state().line)')"

# The engine's own tests, one worker in order (-n 0: the suite's two workers are for the whole suite), at a lower
# priority than whatever else runs here; a run of one module or test: give it as the arguments.
if [ "$#" -eq 0 ]; then
  set -- "${core[@]}"
fi
exec nice -n 10 "$venv/bin/python" -m pytest -n 0 -p no:cacheprovider -ra "$@"
