"""Live progress of a run: counters of candidates, references, errors, mismatches and retries."""

from __future__ import annotations

import shutil

from tqdm import tqdm


class Progress:
    """Counters of the run so far, shown as a live tqdm bar (or per-sweep-point lines only)."""

    def __init__(self, total: int, initial: int, enabled: bool) -> None:
        self.enabled = enabled
        self.done = initial  # candidate records, including those of an earlier (resumed) process
        self.errors = self.mismatches = self.retries = self.references = 0
        # a pty that reports a 0x0 size would make tqdm hide the bar; shutil falls back to 110x24
        size = shutil.get_terminal_size((110, 24))
        self.bar = tqdm(total=total, initial=initial, disable=not enabled, unit="req", desc="candidates",
                        ncols=size.columns, nrows=size.lines)

    def _refresh(self) -> None:
        self.bar.set_postfix(errors=self.errors, mismatches=self.mismatches, retries=self.retries,
                             refs=self.references, refresh=False)

    def candidate(self, record: dict) -> None:
        self.done += 1
        self.errors += record["error"] is not None
        self.bar.update(1)
        self._refresh()

    def reference(self, record: dict) -> None:
        self.references += 1
        self._refresh()

    def retry(self) -> None:
        self.retries += 1
        self._refresh()

    def mismatch(self) -> None:
        self.mismatches += 1
        self._refresh()

    def write(self, line: str) -> None:
        if self.enabled:
            tqdm.write(line)
        else:
            print(line, flush=True)

    def close(self) -> None:
        self.bar.close()
