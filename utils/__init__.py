"""What the page, the benchmark and the API share to show a run: its events as frames and figures (`metrics`), those
frames as altair charts (`charts`), files to download (`export`), user text shown as text (`plain_text`), and the
entry points' logging (`log_setup`)."""
