"""Where an exporter listens (``HOST:PORT``), and an exporter started beside a program
(``instr exec --metrics``, ``instr serve --metrics``) in a process of its own.

The listening socket is bound by the command that starts the program, before the program starts:
a port in use is one line and exit 2 then, not a server running without its metrics. The exporter
process inherits the socket, follows the log from where the program begins writing, and ends once
the program has ended and its log is read to the end.

The exporter is a process of its own, the interpreter running ``beside`` (``BESIDE``): ``instr
exec`` becomes the program it starts (no thread of it is left to serve), and a scrape must not take
the CPU of the program it measures (the exporter runs niced). It calls this module, not the
command line.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from llamacpp_instr.converters.formats.log_input import UserError

# the exporter's process: ``beside`` with LOG FD AFTER PARENT_PID
BESIDE = (
    "import sys\n"
    "from llamacpp_instr.running.exporter_launch import beside\n"
    "beside(sys.argv[1:])\n"
)


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9400`` for IPv6; ``:9400``: every interface) -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UserError(
            f"--prometheus/--metrics wants HOST:PORT, e.g. 127.0.0.1:9400 (got {text!r})"
        )
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return host or "0.0.0.0", int(port)


def bind(text: str) -> socket.socket:
    """A socket listening at ``text`` (``HOST:PORT``); UserError when the port is in use."""
    host, port = parse_listen(text)
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise UserError(f"cannot resolve host {host!r}: {exc.strerror}") from None
    s = socket.socket(family, kind, proto)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(addr)
        s.listen(64)
    except OSError as exc:
        s.close()
        if exc.errno == errno.EADDRINUSE:
            raise UserError(
                f"port {port} on {host} is in use (choose another for metrics)"
            ) from None
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return s


def url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"


def start_beside(log: Path, listen: str) -> subprocess.Popen[bytes]:
    """Start the exporter (``serve``, in a process of its own: ``BESIDE``) on ``log`` at
    ``listen`` for the program this process is about to run (or become, with exec): it reads what
    the program appends to ``log`` (from its size now), and ends when this process has ended and
    the log is read."""
    sock = bind(listen)
    try:
        offset = log.stat().st_size if log.is_file() else 0
        fd = sock.fileno()
        cmd = [sys.executable, "-c", BESIDE, str(log.resolve()), str(fd), str(offset)]
        cmd.append(str(os.getpid()))
        print(f"instr: metrics at {url(sock)}", file=sys.stderr, flush=True)
        # a session of its own: Ctrl-C at the terminal goes to the program, and the exporter reads
        # on until the program has written its last record
        return subprocess.Popen(
            cmd, pass_fds=(fd,), stdin=subprocess.DEVNULL, start_new_session=True
        )
    finally:
        sock.close()  # the exporter holds it now (and the program must not inherit it)


class _Stop(Exception):
    """SIGTERM: stop serving (exit 0)."""


def _on_term(signum: int, frame: FrameType | None) -> None:
    raise _Stop


def serve(
    log: Path,
    sock: socket.socket,
    wait: float,
    after: int | None = None,
    parent_pid: int | None = None,
) -> None:
    """Follow ``log`` (from byte ``after``; a rotated series included) and serve its figures at
    /metrics on ``sock`` until Ctrl-C or SIGTERM, or, beside a program (``parent_pid``, which
    started this process), until that program has ended and its log is read."""
    from llamacpp_instr.converters.formats.live_figures import RequestTracker
    from llamacpp_instr.converters.formats.prometheus import Metrics, serve_http
    from llamacpp_instr.converters.reading.tail import follow_log

    if parent_pid is not None:
        wait = float("inf")  # the program beside it creates the log when it opens its session
    metrics = Metrics()
    server = serve_http(sock, metrics.registry)
    stop: Callable[[], bool] | None = None
    if parent_pid is not None:
        os.nice(5)  # beside the program it measures: the program's CPU comes first

        def stop() -> bool:
            return os.getppid() != parent_pid

    signal.signal(signal.SIGTERM, _on_term)
    tracker = RequestTracker()
    try:
        for rec in follow_log(log, wait=wait, stop=stop, offset=after):
            metrics.observe(tracker.add(rec))
    except (KeyboardInterrupt, _Stop):
        pass
    finally:
        server.shutdown()
        sys.stderr.flush()


def beside(argv: list[str]) -> None:
    """The exporter's process (``start_beside``): ``argv`` is LOG FD AFTER PARENT_PID, the socket
    inherited as FD; a bad log is one line on stderr and exit 2, as the command line says it."""
    log, fd, after, parent = argv
    try:
        serve(Path(log), socket.socket(fileno=int(fd)), float("inf"), int(after), int(parent))
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
