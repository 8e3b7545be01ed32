"""Progress for what a user waits on: a tqdm bar on a terminal (shown once the
wait passes `delay` seconds), plain lines on stderr otherwise (at most every
`every` seconds, the first after `every`)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field


@dataclass(slots=True)
class Progress:
    total: int  # 0: unknown
    desc: str
    unit: str = "req"
    enabled: bool = True
    # Without a terminal: a line at most this often (seconds).
    every: float = 5.0
    # On a terminal: no bar for waits shorter than this (seconds).
    delay: float = 0.0
    n: int = 0
    _bar: object = None
    _last: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        if self.enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=self.total or None, desc=self.desc, unit=self.unit,
                             leave=False, delay=self.delay)

    def update(self, k: int = 1) -> None:
        self.n += k
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(k)
        elif time.monotonic() - self._last >= self.every:
            self._last = time.monotonic()
            of = f"/{self.total}" if self.total else ""
            print(f"{self.desc}: {self.n}{of} {self.unit}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
