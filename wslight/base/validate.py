"""The one vocabulary of argument checks, applied where values enter (constructors, the CLI, the public functions).

Every check raises a ValueError whose message starts with the key (as the user wrote it, e.g. `n_values` or
`embeddings.layer`), states what is allowed and repeats the value received. Inner functions assume checked values and
only assert shapes.
"""

from __future__ import annotations

import difflib
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

import torch

DTYPES = {"float32": torch.float32, "float64": torch.float64}
T = TypeVar("T")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def integer(
    key: str, value: Any, low: int | None = None, high: int | None = None, allow_none: bool = False, why: str = ""
) -> Any:
    """`value` if it is an int in [low, high] (either bound optional; None too when `allow_none`).

    `why` explains the bounds in the message.
    """
    if allow_none and value is None:
        return None
    if not _is_int(value) or (low is not None and value < low) or (high is not None and value > high):
        if low == 1 and high is None:
            what = "a positive integer"
        elif high is None:
            what = f"an integer >= {low}" if low is not None else "an integer"
        else:
            what = f"an integer in [{low if low is not None else '-inf'}, {high}]"
        why = f" ({why})" if why else ""
        raise ValueError(f"{key} must be {what}{' or None' if allow_none else ''}{why}, got {value!r}")
    return value


def boolean(key: str, value: Any) -> bool:
    """`value` if it is True or False (not 0, 1 or a string)."""
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, got {value!r}")
    return value


def positive_int(key: str, value: Any) -> int:
    """`value` if it is an int >= 1."""
    return integer(key, value, low=1)


def heads(value: Any, d: int) -> int:
    """`value` if it is a number of attention heads that divides d (head dimension d / heads)."""
    value = positive_int("heads", value)
    if d % value:
        raise ValueError(f"heads must divide d={d} (head dimension d / heads), got heads={value!r}")
    return value


def number(key: str, value: Any, low: float | None = None, strict: bool = False, allow_none: bool = False) -> Any:
    """`value` as a float if it is a finite number >= low (> low when `strict`)."""
    if allow_none and value is None:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if strict else value >= low
    if not ok:
        rng = "" if low is None else f" {'>' if strict else '>='} {low:g}"
        raise ValueError(f"{key} must be a finite number{rng}{' or None' if allow_none else ''}, got {value!r}")
    return float(value)


def choice(key: str, value: Any, allowed: Iterable[T]) -> T:
    """`value` if it is one of `allowed`."""
    allowed = list(allowed)
    if value not in allowed:
        raise ValueError(f"{key} must be one of {allowed}, got {value!r}")
    return value


def choices(key: str, values: Any, allowed: Iterable[T]) -> list[T]:
    """A non-empty list of values from `allowed`, repeats dropped, order kept."""
    allowed = list(allowed)
    if isinstance(values, str) or not isinstance(values, (list, tuple)) or not values:
        raise ValueError(f"{key} must be a non-empty list of values in {allowed}, got {values!r}")
    bad = [v for v in values if v not in allowed]
    if bad:
        raise ValueError(f"{key} must contain only values in {allowed}, got {bad[0]!r} (in {list(values)!r})")
    return list(dict.fromkeys(values))


def known_names(what: str, given: Iterable[str], allowed: Sequence[str]) -> None:
    """Refuse a name of `given` that is not in `allowed`, naming the closest (`what`: "a search setting")."""
    for key in given:
        if key not in allowed:
            close = difflib.get_close_matches(key, list(allowed), n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise ValueError(f"{key}: not {what}{hint} (the settings: {', '.join(allowed)})")


def distinct(key: str, values: Sequence[T]) -> list[T]:
    """`values` as a list if no value repeats (a grid with a repeat would run the same trials twice)."""
    counts = Counter(values)
    repeats = [f"{v!r} {'twice' if c == 2 else f'{c} times'}" for v, c in counts.items() if c > 1]
    if repeats:
        raise ValueError(f"{key} must not repeat a value, got {list(values)!r} ({', '.join(repeats)})")
    return list(values)


def repeated(values: Any) -> list:
    """The values of a list given more than once, each once, in the order of their first repeat ([] for a non-list)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        return []
    seen: set = set()
    out: list = []
    for v in values:
        if v in seen and v not in out:
            out.append(v)
        seen.add(v)
    return out


def note_repeats(key: str, values: Any, what: str = "evaluated once") -> None:
    """A one-line note (`wslight.base.notes`) naming `key` and the values it repeats, which are kept once."""
    twice = repeated(values)
    if twice:
        from .notes import note

        shown = ", ".join(map(str, twice))
        note(f"{key} repeats {shown} (given {list(values)}): each is {what}")


def int_list(key: str, values: Any, low: int = 1, repeats: bool = False) -> list[int]:
    """A non-empty list of ints >= low (a grid such as `n_values`), each value once unless `repeats`."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) == 0:
        raise ValueError(f"{key} must list at least one value, got {values!r}")
    bad = [v for v in values if not _is_int(v) or v < low]
    if bad:
        what = "positive integers" if low == 1 else f"integers >= {low}"
        raise ValueError(f"{key} must hold {what}, got {bad}")
    return list(values) if repeats else distinct(key, values)


def positions(key: str, value: Any, n: int) -> list[int]:
    """Token indices from "first" ([0]), "all" or one int / a list of ints in [0, n - 1], repeats dropped."""
    allowed = f"'first', 'all' or a list of ints in [0, {n - 1}]"
    if isinstance(value, str):
        if value == "first":
            return [0]
        if value == "all":
            return list(range(n))
        raise ValueError(f"{key} must be {allowed}, got {value!r}")
    if _is_int(value):
        value = [value]
    if not isinstance(value, Sequence) or len(value) == 0:
        raise ValueError(f"{key} must be {allowed}, got {value!r}")
    for p in value:
        if not _is_int(p) or not 0 <= p < n:
            raise ValueError(f"{key}: every position must be an int in [0, {n - 1}], got {p!r} in {value!r}")
    return list(dict.fromkeys(value))


def dtype(key: str, value: Any, allow_none: bool = False) -> Any:
    """A torch dtype from "float32" / "float64" (or those torch dtypes)."""
    if allow_none and value is None:
        return None
    if isinstance(value, torch.dtype) and value in DTYPES.values():
        return value
    if isinstance(value, str) and value in DTYPES:
        return DTYPES[value]
    raise ValueError(f"{key} must be one of {sorted(DTYPES)}{' or None' if allow_none else ''}, got {value!r}")


def samples(key: str, X: Any, d: int, n: int | None = None) -> torch.Tensor:
    """X as a floating (B, n, d) tensor with B, n >= 1, matching the map's d (and n when the map fixes it)."""
    if not isinstance(X, torch.Tensor) or X.dim() != 3:
        shape = tuple(X.shape) if isinstance(X, torch.Tensor) else type(X).__name__
        raise ValueError(f"{key} must be a tensor of shape (B, n, d), got {shape}")
    if X.shape[0] < 1 or X.shape[1] < 1:
        raise ValueError(f"{key} must have B >= 1 samples and n >= 1 tokens, got shape {tuple(X.shape)}")
    if X.shape[2] != d:
        raise ValueError(f"{key}: the map was built for d={d}, got {key} of shape {tuple(X.shape)} (d={X.shape[2]})")
    if n is not None and X.shape[1] != n:
        raise ValueError(
            f"{key}: the map was built for n={n} tokens, got {key} of shape {tuple(X.shape)} (n={X.shape[1]})"
        )
    if not X.is_floating_point():
        raise ValueError(f"{key} must be a floating-point tensor, got dtype {X.dtype}")
    return X
