"""The embedded model's training: its corpus (`corpus`, from `intents.json`), the run that trains it into
`model/builtin` (`python -m training.train`) and its held-out evaluation (`python -m training.evaluate`). Nothing
the app, the engine or the server runs imports it; `model` only loads what it wrote."""
