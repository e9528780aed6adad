"""Shared engine (everyone's requests): the queue batched live with every tab's requests on the engine they share,
then replayed on private continuous and static batchers, so both are measured the same way."""
