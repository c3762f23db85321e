"""The C library's heap, kept small for a long-lived process that swaps engines: freed
memory given back to the system (:func:`trim_heap`), large blocks mapped on their own
(:func:`keep_heap_small`).  Both do nothing where the C library is not glibc."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any, Final

__all__ = ["MMAP_THRESHOLD", "keep_heap_small", "trim_heap"]

MMAP_THRESHOLD: Final = 4 << 20
"""Blocks this large are mapped on their own, and unmapped when freed."""
_M_TRIM_THRESHOLD: Final = -1
_M_MMAP_THRESHOLD: Final = -3


@functools.cache
def _libc() -> Any:
    """The C library (looked up once: ``find_library`` runs ``ldconfig``)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def trim_heap() -> None:
    """Give freed heap memory back to the system (glibc keeps it for reuse otherwise,
    and a long-lived daemon that swaps engines would grow)."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:  # glibc
        trim(0)


def keep_heap_small() -> bool:
    """Make glibc give large freed blocks back at once; whether it could be told.

    glibc raises its mmap threshold each time a mapped block is freed (up to 32 MiB),
    so the next blocks that large come from a worker thread's heap, whose free top
    ``malloc_trim`` never returns: four gzip bombs left +130 MiB held for good.  A
    fixed threshold (which turns the raising off) keeps them mapped; large runs pay
    page faults, small requests nothing.
    """
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:  # not glibc
        return False
    return bool(
        mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        and mallopt(_M_TRIM_THRESHOLD, 2 * MMAP_THRESHOLD)
    )
