#!/usr/bin/env bash
# Install what the tests need: the Python packages, vLLM in its own environment (scripts/install-vllm.sh: about
# 3.5 minutes the first time, a second when it is there), Debian's chromium for the browser tests and its TCMalloc
# (libtcmalloc-minimal4: the server and the benchmark run on it, batching/allocator.py) when running as root and they are
# missing (Playwright's own browser download does not work offline).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet -r requirements-dev.txt
bash scripts/install-vllm.sh >/dev/null  # its Python is found at the default place; errors still reach stderr
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
python -c "import sys; from batching.allocator import find_tcmalloc; sys.exit(find_tcmalloc() is None)" \
  || missing+=(libtcmalloc-minimal4)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "missing: ${missing[*]} (apt-get install ${missing[*]}): chromium for the browser tests," \
      "libtcmalloc-minimal4 for the allocator's tests" >&2
  fi
fi
