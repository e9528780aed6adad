"""The Q/A template and the answer extractor."""

from model.prompting import DEFAULT_SYSTEM_PROMPT, extract_answer, format_prompt


def test_prompt_has_system_prompt_blank_line_question_and_answer_cue() -> None:
    text = format_prompt("  How do I track my order? ")
    assert text == f"{DEFAULT_SYSTEM_PROMPT}\n\nQ: How do I track my order?\nA:"


def test_an_empty_system_prompt_starts_at_the_question() -> None:
    assert format_prompt("Hi", system_prompt="") == "Q: Hi\nA:"


def test_answer_is_cut_where_the_model_invents_a_next_turn() -> None:
    assert extract_answer(" Use the tracking link.\nQ: And then?\nA: Wait.") == "Use the tracking link."


def test_answer_without_a_next_turn_is_returned_stripped() -> None:
    assert extract_answer(" Returns are free within 30 days. \n") == "Returns are free within 30 days."
