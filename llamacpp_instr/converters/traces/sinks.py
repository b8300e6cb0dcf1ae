"""Where the trace writers' bytes go: helper threads that overlap output with encoding.

* ``ThreadedWriter`` (Chrome JSON): hands chunks of about ``CHUNK`` bytes to one thread that
  writes them to the file in order, so that the kernel's copying (which needs no GIL) overlaps
  the formatting of the next events.
* ``BundleSink`` (Perfetto): plain packets, or zlib-compressed bundles deflated on worker threads
  (zlib and ISA-L release the GIL) while the next packets are encoded, written in order.

A write error is raised in the caller's thread (at the next write, or at ``close``).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import IO, Any

# what a writer hands over at once: bytes, or a list of bytes-like parts (one byte per item:
# bytes, memoryviews of uint8 buffers) joined only where the bytes must be together (a bundle)
Data = bytes | list[Any]


class ThreadedWriter:
    """Writes to ``out`` from a helper thread, in chunks of about ``CHUNK`` bytes."""

    CHUNK = 1 << 20
    DEPTH = 4  # chunks queued at most

    def __init__(self, out: IO[bytes], name: str = "trace-writer") -> None:
        self.out = out
        self.name = name  # the thread's
        self.parts: list[bytes] = []
        self.size = 0
        self.queue: queue.Queue[list[bytes] | None] = queue.Queue(self.DEPTH)
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def write(self, data: bytes) -> None:
        self.parts.append(data)
        self.size += len(data)
        if self.size >= self.CHUNK:
            self._hand_off()

    def _hand_off(self) -> None:
        if self.error is not None:
            raise self.error
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self.thread.start()
        self.queue.put(self.parts)
        self.parts = []
        self.size = 0

    def _run(self) -> None:
        while (parts := self.queue.get()) is not None:
            if self.error is None:
                try:
                    for p in parts:
                        self.out.write(p)
                except BaseException as exc:  # noqa: BLE001 - given to the caller's thread
                    self.error = exc

    def close(self, ok: bool = True) -> None:
        """Write what is left and wait for the thread (``ok=False``: just stop it)."""
        if self.thread is not None:
            self.queue.put(None)
            self.thread.join()
            self.thread = None
        if ok:
            if self.error is not None:
                raise self.error
            for p in self.parts:
                self.out.write(p)
        self.parts = []


class BundleSink:
    """Packets to ``out``: plain, or compressed in bundles of ``chunk`` bytes by ``bundle`` (data
    -> the packet holding it compressed) on ``threads`` workers. Undecided (``compress`` None),
    it holds the first ``auto`` bytes and compresses from there on."""

    def __init__(
        self,
        out: IO[bytes],
        compress: bool | None,
        bundle: Callable[[bytes], bytes],
        *,
        auto: int,
        chunk: int,
        threads: int,
    ) -> None:
        self.out = out
        self.compress = compress
        self.bundle = bundle
        self.auto, self.chunk, self.threads = auto, chunk, threads
        self.parts: list[bytes] = []
        self.size = 0
        self.pool: ThreadPoolExecutor | None = None
        self.futures: list[Future[bytes]] = []

    def write(self, data: Data) -> None:
        """One write (``Data``): a bundle is cut after the write that fills it, as if the parts
        were one bytes object."""
        if isinstance(data, list):
            if self.compress is False:
                self.out.write(b"".join(data))
                return
            self.parts += data
            self.size += sum(map(len, data))
        elif self.compress is False:
            self.out.write(data)
            return
        else:
            self.parts.append(data)
            self.size += len(data)
        if self.compress is None and self.size >= self.auto:
            self.compress = True
        if self.compress and self.size >= self.chunk:
            self._bundle()

    def _bundle(self) -> None:
        data = b"".join(self.parts)
        self.parts = []
        self.size = 0
        if self.pool is None:
            # (as many as the caller says: the writer sizes them to the machine, ``zlib_threads``)
            self.pool = ThreadPoolExecutor(max(1, self.threads), thread_name_prefix="pftrace-zlib")
        self.futures.append(self.pool.submit(self.bundle, data))
        while self.futures and (len(self.futures) > 4 or self.futures[0].done()):
            self.out.write(self.futures.pop(0).result())

    def close(self) -> None:
        if self.parts:
            if self.compress:
                self._bundle()
            else:
                self.out.write(b"".join(self.parts))
                self.parts = []
        for f in self.futures:
            self.out.write(f.result())
        self.futures = []

    def shutdown(self) -> None:
        """Stop the workers (after ``close``, or when the writer failed)."""
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)
