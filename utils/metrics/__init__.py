"""A run's events as pandas frames and figures: a run's requests, steps and summary (`run`), the step inspector's
grid and waste meters (`inspector`), a step's attention mask (`attention_mask`), KV memory (`memory`), a load
sweep's figures (`sweep`) and what each server said about itself at each rate (`sweep_servers`). No drawing here."""
