"""Typed readers for JSON-like input (bundles, policies) that name the bad field.

Every reader raises FieldError("pod.metadata.uid", "missing"); the callers re-raise it
as their own error type (BundleError, PolicyError). Never a KeyError or TypeError.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

_MISSING: Any = object()


class FieldError(ValueError):
    """A field of some input is missing or has the wrong type or value."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "a list"
    return type(value).__name__


def join(parent: str, key: str | int) -> str:
    """`join("pod", "metadata")` → `pod.metadata`; `join("holders", 0)` → `holders[0]`."""
    if isinstance(key, int):
        return f"{parent}[{key}]"
    return f"{parent}.{key}" if parent else key


def as_object(value: object, field: str) -> Mapping[str, object]:
    if not isinstance(value, Mapping):
        raise FieldError(field, f"must be an object, got {_type_name(value)}")
    return value


def as_list(value: object, field: str) -> Sequence[object]:
    if not isinstance(value, list | tuple):
        raise FieldError(field, f"must be a list, got {_type_name(value)}")
    return value


def get(obj: Mapping[str, object], key: str, field: str, default: object = _MISSING) -> object:
    """obj[key], or `default` when absent; FieldError "missing" when absent without default."""
    if key in obj:
        return obj[key]
    if default is _MISSING:
        raise FieldError(join(field, key), "missing")
    return default


def opt_object(obj: Mapping[str, object], key: str, field: str) -> Mapping[str, object]:
    """An optional (absent or null → empty) object field."""
    value = obj.get(key)
    return {} if value is None else as_object(value, join(field, key))


def opt_list(obj: Mapping[str, object], key: str, field: str) -> Sequence[object]:
    """An optional (absent or null → empty) list field."""
    value = obj.get(key)
    return () if value is None else as_list(value, join(field, key))


def string(obj: Mapping[str, object], key: str, field: str, *, nonempty: bool = True) -> str:
    value = get(obj, key, field)
    if not isinstance(value, str):
        raise FieldError(join(field, key), f"must be a string, got {_type_name(value)}")
    if nonempty and not value:
        raise FieldError(join(field, key), "must not be empty")
    return value


def opt_string(obj: Mapping[str, object], key: str, field: str) -> str | None:
    """An optional string: absent, null or "" → None."""
    value = obj.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise FieldError(join(field, key), f"must be a string, got {_type_name(value)}")
    return value


def string_list(obj: Mapping[str, object], key: str, field: str) -> tuple[str, ...]:
    """An optional list of strings (absent or null → empty)."""
    out = []
    for i, item in enumerate(opt_list(obj, key, field)):
        if not isinstance(item, str):
            raise FieldError(join(join(field, key), i), f"must be a string, got {_type_name(item)}")
        out.append(item)
    return tuple(out)


def opt_int(obj: Mapping[str, object], key: str, field: str) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldError(join(field, key), f"must be an integer, got {_type_name(value)}")
    return value


def opt_bool(obj: Mapping[str, object], key: str, field: str) -> bool | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise FieldError(join(field, key), f"must be true, false or null, got {_type_name(value)}")
    return value


def parse_time(value: object, field: str) -> datetime:
    """An RFC 3339 timestamp with a timezone (`2026-11-20T10:00:00Z`)."""
    if not isinstance(value, str):
        raise FieldError(field, f"must be an RFC 3339 timestamp string, got {_type_name(value)}")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise FieldError(field, f"{value!r} is not an RFC 3339 timestamp") from None
    if parsed.tzinfo is None:
        raise FieldError(field, f"{value!r} has no timezone (use e.g. a trailing 'Z')")
    return parsed


def opt_time(obj: Mapping[str, object], key: str, field: str) -> datetime | None:
    value = obj.get(key)
    return None if value is None else parse_time(value, join(field, key))
