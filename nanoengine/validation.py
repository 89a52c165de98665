"""Checks of a user's arguments, run before anything is queued (vLLM checks at the same door:
SamplingParams._verify_args, then verify() against the model when the request is made).

Each check returns the value in its plain Python type (a numpy integer becomes an int) or raises
`error`, an InvalidArgumentError subclass, with a message that names the argument, shows what was
given and says what to pass instead. bool is refused where a number is asked for: True is an int to
Python, but `max_tokens=True` is a slip, not a request for one token.
"""

from __future__ import annotations

import difflib
import math
import numbers
import reprlib
from collections.abc import Collection, Mapping

from nanoengine.errors import InvalidArgumentError


def _bounds(low, high) -> str:
    if low is not None and high is not None:
        return f" in [{low}, {high}]"
    if low is not None:
        return f" >= {low}"
    return f" <= {high}" if high is not None else ""


def _fail(error: type[InvalidArgumentError], name: str, value, wanted: str, hint: str):
    shown = reprlib.repr(value) if isinstance(value, (numbers.Number, str, type(None))) else f"a {type(value).__name__}"
    raise error(f"{name} must be {wanted}, got {shown}.{' ' + hint if hint else ''}", parameter=name, value=value)


def check_int(
    error: type[InvalidArgumentError],
    name: str,
    value,
    *,
    low: int | None = None,
    high: int | None = None,
    none_ok: bool = False,
    hint: str = "",
) -> int | None:
    """An integer in [low, high] (either bound may be open), or None where none_ok."""
    if value is None and none_ok:
        return None
    wanted = f"an integer{_bounds(low, high)}{' or None' if none_ok else ''}"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        _fail(error, name, value, wanted, hint)
    value = int(value)
    if (low is not None and value < low) or (high is not None and value > high):
        _fail(error, name, value, wanted, hint)
    return value


def check_real(
    error: type[InvalidArgumentError],
    name: str,
    value,
    *,
    low: float,
    high: float | None,
    low_open: bool = False,
    hint: str = "",
) -> float:
    """A finite number in [low, high], or (low, high] where low_open; high None leaves it unbounded above.
    NaN and infinities never pass."""
    if high is None:
        wanted = f"a finite number {'>' if low_open else '>='} {low}"
    else:
        wanted = f"a finite number in {'(' if low_open else '['}{low}, {high}]"
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        _fail(error, name, value, wanted, hint)
    value = float(value)
    if (high is not None and value > high) or value < low or (low_open and value == low):
        _fail(error, name, value, wanted, hint)
    return value


def check_bool(error: type[InvalidArgumentError], name: str, value) -> bool:
    if not isinstance(value, bool):
        _fail(error, name, value, "True or False", "")
    return value


def check_choice(error: type[InvalidArgumentError], name: str, value, choices: Collection) -> str:
    if not isinstance(value, str) or value not in choices:
        _fail(error, name, value, f"one of {sorted(choices)}", "")
    return value


def check_optional_str(error: type[InvalidArgumentError], name: str, value) -> str | None:
    if value is not None and not isinstance(value, str):
        _fail(error, name, value, "a string or None", "")
    return value


def check_names(
    error: type[InvalidArgumentError],
    where: str,
    given: Mapping[str, object],
    known: Collection[str],
    unsupported: Mapping[str, str] | None = None,
) -> None:
    """Refuse, by name, an argument `where` does not take (given maps names to values), where Python would raise
    a bare TypeError. One of vLLM's that nanoengine lacks (a key of unsupported) says so, with the reason its
    value gives; any other name gets the closest known one (difflib), if one is close."""
    unsupported = unsupported or {}
    for name in given:
        if name in known:
            continue
        if name in unsupported:
            shown = reprlib.repr(given[name])
            message = f"nanoengine's {where} does not support {name} (given {shown}): {unsupported[name]}"
        else:
            close = difflib.get_close_matches(name, [*known, *unsupported], n=1)
            suggestion = f" Did you mean {close[0]}?" if close else ""
            message = f"{where} got an unknown argument {name}.{suggestion} It takes: {', '.join(sorted(known))}."
        raise error(message, parameter=name, value=given[name])
