"""Give memory the analysis has freed back to the system between its stages.

A render frees large parts as it goes (the index, the token pass's chunks, columns replaced), but the allocators
keep what was freed: glibc's heap keeps freed blocks below its mmap threshold (most numpy and pandas arrays of a
chunk's size) until the space at its top is free, and Arrow's pool keeps its pages. What is kept counts in the
process's resident memory as if it were held, and the next stage's transients come on top of it wherever they do
not fit the holes. `release()` hands both back: glibc's `malloc_trim(0)` (every free page of the heap, not only
its top) and Arrow's `release_unused`. Elsewhere (another libc, another system) it does what it can and nothing
else; it never frees anything still in use.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

import pyarrow as pa


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, looked up once; None where there is none."""
    try:
        trim = getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), "malloc_trim", None)
    except OSError:
        return None
    if trim is not None:
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release() -> bool:
    """Return the allocators' free memory to the system; True if glibc's heap was trimmed."""
    pa.default_memory_pool().release_unused()
    trim = _malloc_trim()
    return bool(trim is not None and trim(0))
