"""A request body converted into its model (herald/protocol/), or PROTOCOL §2's error
with the field's path: the server converts every JSON body with it (server/validation.py)
and the SDK checks its arguments with it before a request is sent (herald/admin.py), so
both refuse the same body with the same code and detail."""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec

from herald.protocol.errors import BadRequest, HeraldError, OutOfRange, ValidationError

T = TypeVar("T")

_MODEL_DEPTH = 8  # deeper than any model nests; deeper input is a type error anyway

# msgspec says "Expected `int` >= 100", "Expected `array` of length <= 5": a well-formed
# value out of range, as is a model's own OutOfRange. Anything else (a wrong type, an
# unknown or missing field, a value outside its enumerated set) is malformed.
_OUT_OF_RANGE = re.compile(r"^Expected `[^`]*` (?:of length )?[<>]=")


def from_model(body: Any, model: type[T], what: str) -> T:
    """``body`` as ``model``, or PROTOCOL §2's problem with the field's path."""
    try:
        return msgspec.convert(integral(body), model, strict=True)
    except msgspec.ValidationError as exc:
        raise model_error(exc, what) from None


def integral(value: Any, depth: int = 0) -> Any:
    """``value`` with each integral float an int (``2.0`` is an integer, PROTOCOL §2), to
    the depth a model nests; msgspec's strict mode takes ``2.0`` for a float only."""
    if type(value) is float and value.is_integer():
        return int(value)
    if depth >= _MODEL_DEPTH:
        return value
    if type(value) is dict:
        return {k: integral(v, depth + 1) for k, v in value.items()}
    if type(value) is list:
        return [integral(v, depth + 1) for v in value]
    return value


def model_error(exc: msgspec.ValidationError, what: str) -> HeraldError:
    """msgspec's error as PROTOCOL §2's problem, with the field's path: ``validation_error``
    for a value out of range, ``bad_request`` for anything else."""
    message, _, where = str(exc).partition(" - at `$")
    path = where.rstrip("`").lstrip(".")
    if isinstance(exc.__cause__, ValueError):  # a model's own check names its field first
        detail = f"{path}.{message}" if path else message
    else:
        detail = f"{path}: {message}" if path else f"{what}: {message}"
    if isinstance(exc.__cause__, OutOfRange) or _OUT_OF_RANGE.match(message):
        return ValidationError(detail)
    return BadRequest(detail)
