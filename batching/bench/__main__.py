"""`python -m batching.bench`: the benchmark CLI."""

import sys

from batching.bench.cli import main

sys.exit(main())
