"""Altair chart builders, each taking a frame from `utils.metrics` (or shaping its own from a run) and returning a
chart: a run's occupancy, latency and slot timeline (`run`), the step inspector (`inspector`), KV memory (`memory`),
the load sweep (`sweep`), a server's telemetry (`telemetry`), and why requests wait (`waits`)."""
