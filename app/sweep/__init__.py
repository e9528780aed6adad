"""Load sweep: the prompt mix at a list of request rates, on this tab's engine (a race per rate) or on servers
already running; latency, throughput and SLO attainment against the rate."""
