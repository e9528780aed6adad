"""The Q/A prompt template of the original design, and the way back from a completion to its answer."""

from __future__ import annotations

from config.settings import DEFAULT_SYSTEM_PROMPT, DEFAULT_TEMPLATE

# Where an answer ends if the model goes on to invent the next turn.
_TURN_MARKERS = ("\nQ:",)


def format_prompt(
    prompt: str,
    system_prompt: str = DEFAULT_SYSTEM_PROMPT,
    template: str = DEFAULT_TEMPLATE,
) -> str:
    """Fill the template with a user prompt (stripped) and the system prompt.

    An empty system prompt drops the system block and its blank line, so the prompt starts at `Q:`.
    """
    text = template.format(system_prompt=system_prompt.strip(), prompt=prompt.strip())
    return text.lstrip("\n") if not system_prompt.strip() else text


def extract_answer(completion: str) -> str:
    """Return just the answer from the generated text that follows a formatted prompt.

    Generation stops at EOS, but a model may also go on to invent the next `Q:` turn: cut it there.
    """
    for turn in _TURN_MARKERS:
        cut = completion.find(turn)
        if cut != -1:
            completion = completion[:cut]
    return completion.strip()
