"""A TCP proxy on loopback that counts what it forwards: each chunk's size, direction and the time
it arrived (CLOCK_MONOTONIC, the session log's clock), so that a test can see what went over the
wire in a window of the log's time without trusting the log's own figures."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class Wire:
    """The chunks forwarded so far: (arrival ns, "up" for client to server or "down", bytes)."""

    chunks: list[tuple[int, str, int]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def bytes_in(self, way: str, t0: int, t1: int) -> int:
        """The bytes that arrived going ``way`` in [t0, t1]."""
        with self.lock:
            return sum(n for t, w, n in self.chunks if w == way and t0 <= t <= t1)


def _pump(src: socket.socket, dst: socket.socket, way: str, wire: Wire) -> None:
    try:
        while data := src.recv(1 << 16):
            with wire.lock:
                wire.chunks.append((time.monotonic_ns(), way, len(data)))
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


@contextmanager
def tap(upstream: str) -> Iterator[tuple[str, Wire]]:
    """A proxy to ``upstream`` (HOST:PORT): its endpoint and the Wire it counts on. Each client
    connection gets a connection of its own to upstream."""
    host, port = upstream.rsplit(":", 1)
    listener = socket.create_server(("127.0.0.1", 0))
    wire = Wire()
    conns: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                client, _ = listener.accept()
                server = socket.create_connection((host, int(port)), timeout=30)
            except OSError:
                return
            server.settimeout(None)
            conns.extend((client, server))
            for a, b, way in ((client, server, "up"), (server, client, "down")):
                threading.Thread(target=_pump, args=(a, b, way, wire), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}", wire
    finally:
        try:
            listener.shutdown(socket.SHUT_RDWR)  # (wakes the accept)
        except OSError:
            pass
        listener.close()
        for s in conns:
            s.close()
