#!/usr/bin/env bash
# Install what the tests need: the Python packages, vLLM in its own environment (scripts/install-vllm.sh: about
# 3.5 minutes the first time, a second when it is there), and Debian's chromium for the browser tests (when running
# as root and it is missing; Playwright's own browser download does not work offline).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet -r requirements-dev.txt
bash scripts/install-vllm.sh >/dev/null  # its Python is found at the default place; errors still reach stderr
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "chromium is missing: install Debian's chromium (apt-get install chromium) for the browser tests" >&2
  fi
fi
