"""reports/release.py finds glibc's malloc_trim where there is glibc, and releasing never frees what is in use."""

from __future__ import annotations

import platform

import numpy as np
import pyarrow as pa

from reports import release as R


def test_release_trims_glibcs_heap_where_there_is_one_and_keeps_what_is_held():
    if platform.libc_ver()[0] == "glibc":
        assert R._malloc_trim() is not None
    held = [np.arange(i, i + 1000) for i in range(200)]
    freed = [np.ones(5000) for _ in range(200)]
    text = pa.array([f"key-{i}" for i in range(10000)])
    del freed
    assert isinstance(R.release(), bool)
    assert all(int(a[0]) == i and int(a[-1]) == i + 999 for i, a in enumerate(held))
    assert text[9999].as_py() == "key-9999"
