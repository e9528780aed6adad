"""The embedded model's training data (`training.corpus`): seeded, held-out phrasings kept out, answers of
different lengths on purpose."""

from __future__ import annotations

from training.corpus import WORKLOAD_QUERIES, heldout_examples, normalize, training_examples


def test_corpus_is_deterministic_for_a_seed() -> None:
    assert training_examples(200, seed=7) == training_examples(200, seed=7)
    assert training_examples(200, seed=7) != training_examples(200, seed=8)
    assert heldout_examples() == heldout_examples()


def test_heldout_phrasings_include_the_workload_and_never_appear_in_training() -> None:
    heldout = heldout_examples()
    assert set(WORKLOAD_QUERIES) <= {example.question for example in heldout}
    training = {f" {normalize(example.question)} " for example in training_examples(5000)}
    for example in heldout:
        phrase = f" {normalize(example.question)} "
        assert not any(phrase in question for question in training), example.question


def test_answer_lengths_differ_on_purpose_between_intents() -> None:
    lengths = {example.intent: len(example.answer.split()) for example in heldout_examples()}
    assert lengths["smartphone_features"] >= 8 * lengths["return_policy"]
