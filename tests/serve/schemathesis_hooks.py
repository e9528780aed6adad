"""Schemathesis hooks for tests/serve/test_openapi.py, loaded through SCHEMATHESIS_HOOKS."""

from __future__ import annotations

import schemathesis
from schemathesis.core.failures import Failure
from schemathesis.core.transport import Response
from schemathesis.generation.case import Case
from schemathesis.hooks import HookContext
from schemathesis.openapi.checks import RejectedPositiveData

# The engine's refusal of a prompt longer than the model's window (batching/engine/builder.py)
PROMPT_TOO_LONG = "allowed: shorten it"


@schemathesis.hook
def filter_failure(context: HookContext, failure: Failure, case: Case, response: Response) -> bool:
    """Every failure counts but the one a JSON schema cannot prevent: a schema-valid prompt longer in tokens than
    the window (a schema counts characters, the model tokens: a character can be four byte tokens), refused with
    the documented 400 that says so."""
    too_long = response.status_code == 400 and PROMPT_TOO_LONG in response.content.decode(errors="replace")
    return not (isinstance(failure, RejectedPositiveData) and too_long)
