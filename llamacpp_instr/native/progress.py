"""What hears a build's progress (``Echo``), and the line that says where a long build is
(``Progress``: ninja's [n/m] every 20 seconds), for the wheel's and the tools' builds.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

Echo = Callable[[str], None]


class Progress:
    """Prints the build's progress (ninja's [n/m]) every few seconds, so a 10-minute build isn't silent."""

    def __init__(self, echo: Echo, log: Path) -> None:
        self.echo = echo
        self.log = log
        self.t0 = time.monotonic()
        self.last = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(20):
            try:
                tail = self.log.read_bytes()[-8192:].decode(errors="replace")
            except OSError:
                continue
            steps = re.findall(r"\[(\d+)/(\d+)\]", tail)
            where = f"step {steps[-1][0]}/{steps[-1][1]}" if steps else "configuring"
            self.echo(f"  building ... {int(time.monotonic() - self.t0)}s, {where}")

    def __enter__(self) -> Progress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
