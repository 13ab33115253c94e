"""msgspec's error messages, read for what they say: msgspec has no structured errors, so the
path of a ``ValidationError`` (``Expected `int`, got `str` - at `$.questions[0].id```), the
field a ``missing required field`` names and the byte a ``DecodeError`` points at are read from
its words here, and only here."""

from __future__ import annotations

import re

from cascade.overrides import require

require("msgspec", ">=0.22,<0.23", __name__)

_AT = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_STEP = re.compile(r"\.(\w+)|\[(\d+|\.\.\.)\]")
_MISSING = re.compile(r"Object missing required field `(\w+)`")
_BYTE = re.compile(r"\(byte (\d+)\)$")
_TOO_LONG = "Expected `str` of length <="
_BOUND = re.compile(r"Expected `(int|float)` [<>]=? -?[0-9.e+]+$")


def split(message: str) -> tuple[str, list[str | int]]:
    """A ``ValidationError``'s message as its reason and where it is: ``.questions[0].type``
    -> ``["questions", 0, "type"]``; an index msgspec elides (``[...]``) is left out; ``[]``
    for the top of the document."""
    found = _AT.search(message)
    reason = message[: found.start()] if found else message
    loc: list[str | int] = []
    for name, index in _STEP.findall(found.group("path")) if found else []:
        if name:
            loc.append(name)
        elif index != "...":
            loc.append(int(index))
    return reason, loc


def missing_field(reason: str) -> str | None:
    """The field a ``missing required field`` reason names, else ``None``."""
    found = _MISSING.match(reason)
    return found.group(1) if found else None


def out_of_bounds(reason: str) -> bool:
    """Whether ``reason`` (or a message ending with it) is a number outside the bounds its
    ``Meta`` declares (``Expected `int` >= 1``)."""
    return _BOUND.search(reason) is not None


def too_long(reason: str) -> bool:
    """Whether ``reason`` is a string over its ``max_length``."""
    return reason.startswith(_TOO_LONG)


def error_byte(error: Exception, size: int) -> int:
    """The byte offset a ``DecodeError`` on a ``size``-byte document points at: the end of a
    truncated one, 0 when the message names none."""
    found = _BYTE.search(str(error))
    if found:
        return int(found.group(1))
    return size if "truncated" in str(error) else 0
