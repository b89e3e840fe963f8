"""A value that exists only inside a ``with`` block: the run memos of both packages (shared work of
one reproduction run) are on only while their caller asks, and never leak into later calls."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class Scoped(Generic[T]):
    """``active`` is None, except inside ``enabled()``, where it is one ``factory()`` value (a nested
    block shares the outer one)."""

    def __init__(self, factory: Callable[[], T]):
        self.factory = factory
        self.active: T | None = None

    @contextmanager
    def enabled(self) -> Iterator[T]:
        if self.active is not None:
            yield self.active
            return
        self.active = self.factory()
        try:
            yield self.active
        finally:
            self.active = None


__all__ = ["Scoped"]
