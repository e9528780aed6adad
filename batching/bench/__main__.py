"""`python -m batching.bench SUBCOMMAND`: the benchmark's one command line (`cli.py`)."""

import sys

from batching.bench.cli import main

sys.exit(main())
