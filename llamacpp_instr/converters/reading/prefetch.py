"""Reading a big log on the other core, for the trace writers.

Turning a log into a trace is two jobs of about equal size: parsing the lines (orjson, then each
compute's ``ops`` list into int64 columns) and encoding the trace. Python runs one of them at a
time, so for a big log a forked process does the first: it reads the records with
``reader.iter_records`` and sends them over a pipe in batches, each compute's ops already as
columns and its layers as rows (the one packer: ``decode.columns.pack_ops``,
``decode.columns.layer_rows``), and where a record's device rows (a compute's placement, a
``transfers`` record) are well-formed, their decoded form (``decode.fields.DECODED``), while this
process builds and encodes the trace. A batch holds at most ``BATCH`` records and about
``BATCH_BYTES`` of their lines, and a record of a long line (``BIG_RECORD``) goes as its JSON, so
that a few huge records are neither held at once nor unpickled slower than parsed. What it yields,
and what ``report`` ends up saying, are exactly what ``iter_records`` would have given (skipped
lines in their place; a decoded form is what decoding the record here would give); a ``strict``
error is raised here. Small logs, platforms without ``fork``, machines with one core and processes
already running threads (where forking is unsafe) read in this process.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import threading
from collections.abc import Iterator
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import orjson

from llamacpp_instr.contract.errors import UserError

from .decode.columns import layer_rows, pack_ops
from .decode.fields import DECODED, MALFORMED
from .decode.placement import kept_placement
from .decode.transfers import transfers
from .reader import ReadReport, iter_records

# smaller logs are read in this process: a fork would not pay for itself. to-perfetto's wall time on
# replicated SmolLM2 logs (CPU, RPC, Vulkan), forked against not, on this project's 2-core
# machine: 1.5-1.7 MB and 2.6-3.0 MB even (within 5 ms either way), 3.5-4.1 MB 8-10 ms less
# (3 %), 4.8-5.6 MB 14-34 ms less (5-10 %), 8.8 MB 6-8 %, 22-26 MB 10-14 %
MIN_BYTES = 4 << 20
# the tables (``analysis.frames``) do less per record than the trace writers, so for them the fork
# pays from a bigger log: load_session on the same logs, forked against not, 4.8-5.6 MB from 21 ms
# slower to 15 ms faster, 7.6-8.9 MB 8-26 ms faster (2-6 %), 11-13 MB 6-10 %, 22-26 MB 5-13 %
TABLES_MIN_BYTES = 8 << 20
BATCH = 128  # records per message
# a message's lines, at most, so that a few huge records (a forged log's) are not all held at
# once, parsed, on both sides of the pipe: what the pipe holds
BATCH_BYTES = 1 << 20
# a record whose line is this long or longer goes over the pipe as JSON (orjson's, parsed again on
# the reading side): unpickling a record of many small lists takes twice as long as parsing it
BIG_RECORD = 1 << 18
FIRST_BATCH = 4  # the first message: the reading side waits for it
AHEAD = 16  # messages the reader may have ready beyond what the pipe holds


class _Json(bytes):
    """A record sent as its JSON (``BIG_RECORD``)."""


def records(
    path: Path | str,
    *,
    strict: bool = False,
    report: ReadReport | None = None,
    min_bytes: int | None = None,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """``reader.iter_records``, in a forked process for a big log (see the module doc): then a
    compute record's ``ops`` may come as ``PackedOps``. Big: ``min_bytes`` or more (None:
    ``MIN_BYTES``)."""
    rep = report if report is not None else ReadReport()
    try:
        size = Path(path).stat().st_size
        big = size >= (MIN_BYTES if min_bytes is None else min_bytes)
    except OSError:
        big = False  # iter_records says what is wrong
    if not big or not can_fork():
        yield from iter_records(path, strict=strict, report=rep)
        return
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    _widen(send.fileno())
    proc = ctx.Process(target=_read, args=(send, path, strict), daemon=True)
    proc.start()
    send.close()
    try:
        while True:
            try:
                msg = recv.recv()
            except EOFError:
                raise UserError(f"{path}: the log reader process ended early") from None
            if msg[0] == "batch":
                for n, rec, why in msg[1]:
                    if rec is None:
                        rep.skipped.append((n, why))
                    else:
                        yield n, orjson.loads(memoryview(rec)) if type(rec) is _Json else rec
            elif msg[0] == "end":
                rep.lines, rep.records, rep.replaced_utf8, rep.bytes = msg[1:5]
                rep.unknown_types.update(msg[5])
                return
            else:  # "error": a strict reader's complaint, or what stopped the reader
                raise UserError(msg[1])
    finally:
        recv.close()
        if proc.is_alive():
            proc.terminate()
        proc.join()


def _widen(fd: int) -> None:
    """Let the pipe hold a whole message (Linux: 1 MiB, the unprivileged limit, rather than
    64 KiB): a message then goes in one write, and the reading side does not wait for the
    sending thread to get the GIL back for every 64 KiB of it."""
    try:
        import fcntl

        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, 1 << 20)
    except (ImportError, AttributeError, OSError):
        pass  # another platform, or a lower limit: smaller writes, the same messages


def can_fork() -> bool:
    return (
        "fork" in multiprocessing.get_all_start_methods()
        and threading.active_count() == 1  # forking a threaded process can deadlock the child
        and cores() > 1  # (on one core, the two would take turns: only the fork's cost left)
        and not os.environ.get("LLAMACPP_INSTR_NO_PREFETCH")
    )


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # (not on every platform)
        return os.cpu_count() or 1


class _Gone(Exception):
    """The reading side has stopped reading (it ended early): the reader stops too."""


class _Sender:
    """Sends the reading process's messages from a thread. A pipe holds 64 KiB, less than one
    message: sending from the parsing loop, the reader could never be more than a message ahead,
    and it stood still through every one of the writer's flushes. From here it parses on while
    up to ``AHEAD`` messages wait (``Connection.recv`` unpickles them as ``send`` would have
    pickled them)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.queue: queue.Queue[Any] = queue.Queue(AHEAD)
        self.failed = False  # the reading side has gone: what is left is dropped
        self.thread = threading.Thread(target=self._run, name="log-reader-send", daemon=True)
        self.thread.start()

    def send(self, msg: tuple[Any, ...]) -> None:
        if self.failed:
            raise _Gone
        self.queue.put(ForkingPickler.dumps(msg))

    def _run(self) -> None:
        while (data := self.queue.get()) is not None:
            if not self.failed:
                try:
                    self.conn.send_bytes(data)
                except BaseException:  # noqa: BLE001 - the parsing loop stops at its next send
                    self.failed = True

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join()
        self.conn.close()


def _read(conn: Any, path: Path | str, strict: bool) -> None:
    """The reading process: records in batches, skipped lines in their place, then the totals."""
    # ended by the reading side (terminate: SIGTERM) as a process ends, quietly: not through the
    # handlers it was forked with (a library's that wraps them may turn it into a
    # KeyboardInterrupt and its traceback); a terminal's Ctrl-C is the reading side's to act on
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    out = _Sender(conn)
    try:
        _read_to(out, path, strict)
    except _Gone:
        pass  # nobody is left to tell
    finally:
        out.close()


def _read_to(out: _Sender, path: Path | str, strict: bool) -> None:
    rep = ReadReport()
    batch: list[tuple[int, Any, str]] = []
    last: dict[tuple[Any, ...], dict[int, list[int]]] = {}  # per graph: the last fused ops
    n_skipped = 0
    size = FIRST_BATCH
    at = 0  # rep.bytes where the batch began
    was = 0  # rep.bytes before the record
    try:
        for n, rec in iter_records(path, strict=strict, report=rep):
            big = rep.bytes - was >= BIG_RECORD
            was = rep.bytes
            if len(rep.skipped) > n_skipped:
                batch += [(m, None, why) for m, why in rep.skipped[n_skipped:]]
                n_skipped = len(rep.skipped)
            if rec["type"] == "compute":
                key = (rec.get("sid"), rec.get("ctx"), rec.get("graph"))
                packed = pack_ops(rec.get("ops"), last.get(key))
                if packed is not None:
                    rec["ops"] = packed
                    if packed.fused:
                        last[key] = packed.fused
                t0 = rec.get("t_start")
                if type(t0) is int and t0 >= 0:  # what the model's reading would accept
                    rows = layer_rows(rec.get("layers"), t0)
                    if rows is not None:
                        rec["layers"] = rows  # absolute, as decode.layer_spans makes them
                    place = kept_placement(rec, t0)
                    if place is not None:  # (its rows checked here, not again there)
                        rec[DECODED] = place
            elif rec["type"] == "transfers":
                try:
                    rec[DECODED] = transfers(rec)
                except MALFORMED:
                    pass  # decoded there, where it is reported in its place
            sent: dict[str, Any] | _Json = rec
            if big and DECODED not in rec and rec["type"] != "compute":
                try:
                    sent = _Json(orjson.dumps(rec))  # (what the reader parsed: JSON's own types)
                except orjson.JSONEncodeError:
                    pass  # (none known) sent as it is
            batch.append((n, sent, ""))
            if len(batch) >= size or rep.bytes - at >= BATCH_BYTES:
                out.send(("batch", batch))
                batch = []
                size = BATCH
                at = rep.bytes
        batch += [(m, None, why) for m, why in rep.skipped[n_skipped:]]
        out.send(("batch", batch))
        out.send(
            ("end", rep.lines, rep.records, rep.replaced_utf8, rep.bytes, dict(rep.unknown_types))
        )
    except UserError as exc:
        out.send(("batch", batch))
        out.send(("error", str(exc)))
    except _Gone:
        raise
    except BaseException as exc:  # noqa: BLE001 - reported to the reading side, never lost
        out.send(("error", f"{path}: reading failed: {type(exc).__name__}: {exc}"))
