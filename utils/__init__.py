"""Helpers shared by the page, the benchmark and the engine's consumers: prompts, metrics, charts."""
