"""The OpenAI-compatible API (`python -m batching.serve`): a client of the shared engine, like the page."""
