"""llama-server started for a replay as ``instr exec`` starts it (the tools' build, the session's
environment, the log chosen and an existing one kept as LOG.old; level detailed), on a free port
where its arguments name none, until GET /health answers 200; then stopped with SIGINT (SIGTERM,
then SIGKILL, if it does not end) once it has settled after its last request, and waited for, so
that its log ends with its session."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx

from llamacpp_instr.contract.errors import UserError

from . import keys

PROGRAM = "llama-server"
# the longest a server may take to load its model and answer /health
READY_S = 600.0
# llama-server's SIGINT handler deadlocks on a signal that lands while its main thread holds its
# task queue's lock, right after a response: a replay lets it settle first
SETTLE_S = 0.5
STOP_S = (60.0, 30.0)  # the wait after SIGINT, then after SIGTERM


class ServerGone(UserError):
    """The server ended before the replay was done: one line, exit status 1."""

    exit_status = 1


@dataclass
class Server:
    """A started llama-server: its process, its base URL, its log, its stderr (kept for the one
    line that says why it ended)."""

    proc: subprocess.Popen[bytes]
    url: str
    log: Path
    stderr: IO[bytes]
    key: str | None = None  # the API key its clients send (``keys``)
    note: str = ""  # once stopped: the last line the instrumentation wrote on its stderr

    def gone(self) -> str | None:
        """Why the server is gone (its exit status and last line), or None while it runs."""
        code = self.proc.poll()
        if code is None:
            return None
        last = last_line(self.stderr)
        return f"{PROGRAM} ended (exit status {code}){': ' + last if last else ''}; its log: {self.log}"


def last_line(f: IO[bytes]) -> str:
    """The last non-empty line written to ``f`` (at most 200 characters)."""
    f.seek(0, 2)
    size = f.tell()
    f.seek(max(0, size - 4096))
    lines = [x.strip() for x in f.read().decode("utf-8", "replace").splitlines() if x.strip()]
    return lines[-1][:200] if lines else ""


def instr_note(f: IO[bytes]) -> str:
    """The last line the instrumented library wrote to ``f`` (``llama-instr: ...``), or ""."""
    f.seek(0)
    note = b""
    for line in f:
        if line.startswith(b"llama-instr:"):
            note = line.strip()
    return note.decode("utf-8", "replace")[:200]


def address(args: Sequence[str]) -> tuple[str, int | None]:
    """The host a client reaches the server's arguments at, and the port they name (None: none)."""
    host, port = "127.0.0.1", None
    for k, a in enumerate(args):
        name, eq, value = a.partition("=")
        if not eq:
            value = args[k + 1] if k + 1 < len(args) else ""
        if name == "--host":
            host = value
        elif name == "--port":
            try:
                port = int(value)
            except ValueError:
                raise UserError(f"{PROGRAM} --port {value!r}: not a port") from None
    if host.endswith(".sock"):
        raise UserError(f"{PROGRAM} --host {host}: a replay reaches a server over TCP only")
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return (f"[{host}]" if ":" in host else host), port


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(args: Sequence[str], log: Path, say: Callable[[str], None]) -> Server:
    """llama-server with ``args`` (and a free ``--port`` when they name none), writing the session
    log ``log`` at level detailed, answering /health; a server that ends first is ``ServerGone``.
    Its ``--api-key``s go in its environment, not on its command line (``keys``)."""
    from llamacpp_instr.native import tools
    from llamacpp_instr.running.exec_program import ExecRequest, environment, session_log

    exe = tools.find_logged(PROGRAM)
    key = keys.keyed(args)
    args = key.args
    host, port = address(args)
    extra: tuple[str, ...] = ()
    if port is None:
        port = free_port()
        extra = ("--port", str(port))
    request = ExecRequest(program=PROGRAM, args=(*args, *extra), output=log, level="detailed")
    out = session_log(request, say)
    say(f"instr replay: session log {out} (level detailed): {PROGRAM} {' '.join(request.args)}")
    stderr = tempfile.TemporaryFile()
    try:
        proc = subprocess.Popen(
            [PROGRAM, *request.args],
            executable=str(exe),
            env=environment(request, out) | key.env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,  # a Ctrl-C reaches the replay, which stops the server
        )
    except OSError as exc:
        stderr.close()
        raise UserError(f"cannot run {exe}: {exc.strerror or exc}") from None
    server = Server(proc, f"http://{host}:{port}", out, stderr, key.key)
    try:
        _wait_ready(server)
    except BaseException:
        stop(server)
        raise
    return server


def _ended_by(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def serving(args: Sequence[str], log: Path, say: Callable[[str], None]) -> Iterator[Server]:
    """``start``, for as long as the block runs: the server is stopped when it ends, however it
    ends (an error, Ctrl-C, or SIGTERM or SIGHUP sent to this process, which end it as they would
    have: the server runs in a session of its own, which no signal to this one reaches)."""
    # (a handler is set in the main thread only: elsewhere the caller's own handlers stand)
    ends = (
        (signal.SIGTERM, signal.SIGHUP)
        if threading.current_thread() is threading.main_thread()
        else ()
    )
    before = {s: signal.signal(s, _ended_by) for s in ends}
    try:
        server = start(args, log, say)
        try:
            yield server
        finally:
            stop(server)
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def _wait_ready(server: Server) -> None:
    deadline = time.monotonic() + READY_S
    with httpx.Client(timeout=5.0, trust_env=False) as client:
        while time.monotonic() < deadline:
            why = server.gone()
            if why is not None:
                raise ServerGone(why)
            try:
                if client.get(f"{server.url}/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
    raise ServerGone(f"{PROGRAM} did not answer {server.url}/health in {READY_S:.0f} s")


def stop(server: Server) -> int:
    """Stop the server (SIGINT once it has settled, then SIGTERM, then SIGKILL) and wait for it:
    its exit status."""
    proc = server.proc
    if proc.poll() is None:
        time.sleep(SETTLE_S)
        for sig, wait in zip((signal.SIGINT, signal.SIGTERM), STOP_S, strict=True):
            proc.send_signal(sig)
            try:
                proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        else:
            proc.kill()
    code = proc.wait()
    server.note = instr_note(server.stderr)
    server.stderr.close()
    return code
