"""`python -m batching.serve`: the OpenAI-compatible API over Batchscope's engine."""

import sys

from batching.serve.server import main

sys.exit(main())
