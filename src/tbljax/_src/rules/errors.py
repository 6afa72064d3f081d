"""tbljax's errors, in one home upstream of every room: the Python-defined classes, the native
ones (`CorruptFileError`, `DecodeError`: raised by the C++ core, `ffi/core/platform/status.h`),
and how a message shows a value (`shown`, cut to a length and saying so). The modules where
users met them (`contract`, `file/fields`, `conversion/convert_options`, `remote/remote`, the
`tbljax` facade) import them from here.

>>> str(ArgumentError(Arg("batch_size"), " must be >= 1"))
'batch_size must be >= 1'
>>> shown(repr(list(range(100))), 12)
'[0, 1, 2, 3,... (390 characters)'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from tbljax._core import CorruptFileError, DecodeError

__all__ = [
    "Arg",
    "ArgumentError",
    "ConversionError",
    "CorruptFileError",
    "DecodeError",
    "FieldError",
    "FieldsNotFound",
    "OutputExistsError",
    "RemoteReadError",
    "shown",
    "worded",
]


def shown(text: str, limit: int = 300) -> str:
    """`text` (a value's repr, a JSON dump) as a message shows it: past `limit` characters, its
    first `limit` and the length it had, so a huge argument (a list of a million paths) cannot
    flood a message, and a cut one says it was cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


_BARE = object()


@dataclasses.dataclass(frozen=True)
class Arg:
    """An argument named in an error message, so that the message reads in the words of whoever
    called: the Python API (`Arg("image_size")` reads `image_size`, `Arg("classes", ...)`
    `classes=`, `Arg("format", "jpeg")` `format='jpeg'`) or the command line, which maps each
    name to its flag (`-s/--image-size`, `--classes`, `--format jpeg`; a switch set True reads
    as the flag alone)."""

    name: str
    value: Any = _BARE  # _BARE: the name alone; Ellipsis: `name=`; else `name=value`

    def words(self, flags: Mapping[str, tuple[str, bool]] | None = None) -> str:
        """In the API's words, or (given `flags`: name -> (flag, is_switch)) the command line's."""
        if flags is None or self.name not in flags:
            api = (
                self.name
                if self.value is _BARE
                else (self.name + "=" + ("" if self.value is ... else repr(self.value)))
            )
            return api if flags is None else f"{api} (Python API only)"  # a command without the flag
        flag, switch = flags[self.name]
        if self.value is _BARE or self.value is ... or (switch and self.value is True):
            return flag
        return f"{flag} {self.value}"


class ArgumentError(ValueError):
    """A bad argument, its message made of text and `Arg`s: str() reads as the Python API,
    `words(flags)` as the command line. `ArgumentError(Arg("image_size"), " must be > 0")`."""

    def __init__(self, *parts: str | Arg):
        self.parts = parts
        super().__init__(self.words())

    def words(self, flags: Mapping[str, tuple[str, bool]] | None = None) -> str:
        return worded(self.parts, flags)


def worded(parts: Sequence[str | Arg], flags: Mapping[str, tuple[str, bool]] | None = None) -> str:
    """Text and `Arg`s as one string, in the API's words or (given `flags`) the command line's."""
    return "".join(p.words(flags) if isinstance(p, Arg) else p for p in parts)


class OutputExistsError(ArgumentError, FileExistsError):
    """The destination exists and overwrite= was not given (an argument error, so the command
    line names its flag)."""

    def __init__(self, dst: str):
        super().__init__(f"{dst} already exists (pass ", Arg("overwrite", True), " to replace it)")


class ConversionError(RuntimeError):
    """A conversion that cannot give a sound file: a strict run met bad input, no record could
    be written, or the labels cannot be made into one classes table. `.skipped` lists the bad
    items (key, source, reason). Nothing is left at the destination, and a file that was
    already there (overwrite=True) is kept as it was."""

    def __init__(self, message: str, skipped: list[dict[str, str]] | None = None):
        super().__init__(message)
        self.skipped = list(skipped or [])


class FieldError(ValueError):
    """A record's value for a field is not of the field's kind (the record is skipped)."""


class FieldsNotFound(ValueError):
    """fields= names an extension that no record of the sources has."""


class RemoteReadError(OSError):
    """A file at a URL that could not be read after every retry: names the URL and the byte."""
