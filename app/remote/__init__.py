"""Remote server: the queue sent to any OpenAI-compatible server in one mode, then the other, next to the server's
telemetry (and, through a fleet's router, each replica's)."""
