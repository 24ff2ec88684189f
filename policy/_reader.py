"""Strict reading of one YAML mapping: every error names the path of the bad field.

What lives here: `PolicyError`, `Section` (reads one mapping; `close()` rejects every key
nobody asked for, so a typo is an error instead of a silent default) and the small checks
the loader's sections share. No policy knowledge.
"""

from __future__ import annotations

from dataclasses import fields
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeVar, get_type_hints

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T")
C = TypeVar("C", bound="DataclassInstance")

# The kinds a config field can be read as by `Section.config`; any other field is given.
_PLAIN = (bool, int, float, str)


class PolicyError(ValueError):
    """A policy that cannot be used; the message starts with the path of the bad field."""


class Section:
    """Reads one mapping; `close()` rejects every key that nobody asked for."""

    def __init__(self, raw: object, path: str) -> None:
        if not isinstance(raw, dict):
            raise PolicyError(f"{path or '<root>'}: expected a mapping, got {kind_of(raw)}")
        self._raw: dict[str, Any] = raw
        self._path = path
        self._seen: set[str] = set()

    def child(self, name: str) -> str:
        return f"{self._path}.{name}" if self._path else name

    def get(self, name: str, kind: type[T], default: T) -> T:
        self._seen.add(name)
        if name not in self._raw or self._raw[name] is None:
            return default
        return expect(self._raw[name], kind, self.child(name))

    def require(self, name: str, kind: type[T]) -> T:
        self._seen.add(name)
        if name not in self._raw:
            raise PolicyError(f"{self.child(name)}: required field is missing")
        return expect(self._raw[name], kind, self.child(name))

    def config(self, config: type[C], **given: object) -> C:
        """A config dataclass: every field but the `given` ones read from this section, in
        the order the class declares them, as the type it declares (bool, int, float or
        str); an absent field takes the class's default. One reader for a section's plain
        fields, so that its defaults are the dataclass's own and never a second copy."""
        kinds, defaults = get_type_hints(config), config()
        values = dict(given)
        for item in fields(config):
            if item.name in given:
                continue
            if kinds[item.name] not in _PLAIN:
                raise TypeError(f"{config.__name__}.{item.name}: not a plain field; give it")
            values[item.name] = self.get(item.name, kinds[item.name], getattr(defaults, item.name))
        return config(**values)

    def section(self, name: str) -> Section:
        self._seen.add(name)
        return Section(self._raw.get(name) or {}, self.child(name))

    def raw(self, name: str) -> object:
        self._seen.add(name)
        return self._raw.get(name)

    def close(self) -> None:
        unknown = sorted(set(self._raw) - self._seen)
        if unknown:
            raise PolicyError(f"{self.child(str(unknown[0]))}: unknown field")


def kind_of(value: object) -> str:
    return "null" if value is None else type(value).__name__


def expect(value: object, kind: type[T], path: str) -> T:
    # bool is an int subclass in Python; a YAML `true` must not pass as a number.
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)  # type: ignore[return-value]
    if not isinstance(value, kind) or (kind in (int, float) and isinstance(value, bool)):
        raise PolicyError(f"{path}: expected {kind.__name__}, got {kind_of(value)}")
    return value


def positive(value: int | float, path: str) -> None:
    if value <= 0:
        raise PolicyError(f"{path}: must be > 0, got {value}")


def one_of(section: Section, name: str, kinds: type[StrEnum], default: StrEnum) -> str:
    """A field whose value must be one of an enumeration's values."""
    value = section.get(name, str, default.value)
    if value not in {kind.value for kind in kinds}:
        names = ", ".join(kind.value for kind in kinds)
        raise PolicyError(f"{section.child(name)}: expected one of {names}, got {value!r}")
    return value


def recorded_files(raw: object, path: str, sample_rate: float) -> tuple[str, float, int] | None:
    """A section that writes files of records (`dir`, `sample_rate` in [0, 1], `keep_days`
    > 0): the decision log's and the traffic record's, which differ in their default rate.
    None: the section is absent, nothing is recorded."""
    if raw is None:
        return None
    sec = Section(raw, path)
    directory = sec.require("dir", str)
    rate = sec.get("sample_rate", float, sample_rate)
    if not 0.0 <= rate <= 1.0:
        raise PolicyError(f"{sec.child('sample_rate')}: must be in [0, 1]")
    keep_days = sec.get("keep_days", int, 7)
    positive(keep_days, sec.child("keep_days"))
    sec.close()
    return directory, rate, keep_days
