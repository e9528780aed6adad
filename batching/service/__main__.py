"""`python -m batching.service COMMANDS_FD OUTPUTS_FD`: the engine process, as `EngineClient` starts it."""

import sys

from batching.service.process import main

main(sys.argv[1:])
