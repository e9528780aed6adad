"""Model loading and the embedded default model."""
