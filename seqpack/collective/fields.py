"""Int64 headers declared once: the fields of every fixed-layout vector seqpack sends.

A :class:`Header` lists its fields in order, each with its meaning; code reads and writes
them by name (a numpy structured dtype of int64 words), and :func:`headers_markdown` renders
the tables of docs/wrapper.md from the same declarations (a test keeps them equal).
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["Header", "headers_markdown"]


@dataclasses.dataclass(frozen=True)
class Header:
    """A fixed int64 layout: ``fields`` are ``(name, meaning)`` pairs, one word each."""

    title: str
    fields: tuple[tuple[str, str], ...]

    @property
    def dtype(self) -> np.dtype:
        return np.dtype([(name, "<i8") for name, _ in self.fields])

    @property
    def words(self) -> int:
        return len(self.fields)

    def index(self, name: str) -> int:
        """Word offset of field ``name``."""
        return [field for field, _ in self.fields].index(name)

    def pack(self, **values: int) -> np.ndarray:
        """int64 ``[words]`` holding ``values`` (every field must be given)."""
        names = [field for field, _ in self.fields]
        if set(values) != set(names):
            raise KeyError(f"{self.title}: got fields {sorted(values)}, expected {names}")
        return np.array([int(values[name]) for name in names], dtype=np.int64)

    def rows(self, count: int, **columns: np.ndarray) -> np.ndarray:
        """int64 ``[count, words]``: field ``name`` of row ``i`` is ``columns[name][i]``
        (every field given, each ``count`` long): the per-sample layout of a table."""
        names = [field for field, _ in self.fields]
        if set(columns) != set(names):
            raise KeyError(f"{self.title}: got fields {sorted(columns)}, expected {names}")
        table = np.zeros((count, len(names)), dtype=np.int64)
        for i, name in enumerate(names):
            table[:, i] = columns[name]
        return table

    def column(self, table: np.ndarray, name: str) -> np.ndarray:
        """Field ``name`` of every row of an int64 ``[rows, >= words]`` table."""
        return table[:, self.index(name)]

    def markdown(self) -> str:
        lines = [f"| {self.title} | meaning |", "| --- | --- |"]
        lines += [f"| `{name}` | {meaning} |" for name, meaning in self.fields]
        return "\n".join(lines) + "\n"


def headers_markdown(headers: tuple[Header, ...]) -> str:
    """The tables of ``headers``, one after another."""
    return "\n".join(header.markdown() for header in headers)
