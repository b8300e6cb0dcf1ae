"""A recorded server session rerun: its requests read and planned once, then sent to llama-server
under each setting in turn (started as ``instr exec`` starts it, one log per setting) or to a
server already running (``url``), every response kept beside the log (``LOG.responses.jsonl``: one
JSON object per request as it ends), and each replay's figures set against the recording's."""

from __future__ import annotations

import contextlib
import shlex
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.converters.reports import replay_stalls
from llamacpp_instr.converters.session import replay_figures as figures
from llamacpp_instr.converters.session.replay_log import Selection, read_replayed, read_served

from . import keys
from . import server as servers
from .client import send_all
from .media import MediaFolder
from .plan import Plan, make_plan

# a replay's progress: (setting, requests) -> a context whose callable hears each request end
# (whether it succeeded)
Progress = Callable[[str, int], AbstractContextManager[Callable[[bool], None]]]


@contextlib.contextmanager
def no_progress(name: str, total: int) -> Iterator[Callable[[bool], None]]:
    yield lambda ok: None


@dataclass(frozen=True)
class ReplayRequest:
    """Replay ``log``'s requests (``selection`` of them, at ``speed``) against llama-server started
    with ``server_args`` (plus each of ``settings``, one replay each) or against ``url``; media from
    ``media``; the replay's log ``output`` (NEW.log; with settings NEW.<k>.log each)."""

    log: Path
    output: Path | None = None
    server_args: tuple[str, ...] = ()
    settings: tuple[str, ...] = ()
    url: str | None = None
    speed: float = 1.0
    selection: Selection = Selection()
    media: Path | None = None
    slo: figures.Slo | None = None
    api_key: str | None = None  # --url's (a server started takes its own arguments')


@dataclass
class ReplayResult:
    """The recording and each replay, as ``replay_figures.Setting`` (the recording first), their
    summaries, and what was not sent (counted by why)."""

    log: Path
    speed: float
    slo: figures.Slo | None
    settings: list[figures.Setting]
    summaries: list[dict[str, Any]]
    skipped: Counter[str] = field(default_factory=Counter)
    session_requests: int = 0
    responses: list[Path] = field(default_factory=list)
    # each run's late tokens by setting, from its own log (``converters.reports.replay_stalls``)
    stalls: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def rows(self) -> list[dict[str, Any]]:
        return [r for s in self.settings for r in s.rows]


def _runs(request: ReplayRequest) -> list[tuple[str, tuple[str, ...], Path]]:
    """Each replay to make: its name, the server's arguments and its log."""
    out = request.output or Path(f"replay_{time.strftime('%Y%m%d_%H%M%S')}.log")
    if request.url is not None:
        return [(request.url, (), out)]
    if not request.settings:
        return [("replay", request.server_args, out)]
    runs = []
    for k, setting in enumerate(request.settings, start=1):
        try:
            extra = tuple(shlex.split(setting))
        except ValueError as exc:
            raise UserError(f"--set {setting!r}: {exc}") from None
        name = out.with_name(f"{out.stem}.{k}{out.suffix}" if out.suffix else f"{out.name}.{k}")
        runs.append((keys.hidden(setting), (*request.server_args, *extra), name))
    return runs


def _writer(
    f: IO[bytes], plan: Plan, tick: Callable[[bool], None]
) -> Callable[[figures.Replayed, str], None]:
    def done(x: figures.Replayed, text: str) -> None:
        line = {
            "index": x.index,
            "id": plan.recorded[x.index].get("id"),
            "status": x.status,
            "error": x.error,
            "text": text,
            "timings": x.timings,
            "sent_ms": x.sent_ns / 1e6,
            "ttft_ms": None if x.ttft_ns is None else x.ttft_ns / 1e6,
            "e2e_ms": None if x.e2e_ns is None else x.e2e_ns / 1e6,
            "itl_ms": [g / 1e6 for g in x.gaps_ns],
            "n_out": x.n_out,
        }
        f.write(orjson.dumps(line) + b"\n")
        tick(x.ok)

    return done


def _against_log(
    name: str, log: Path | None, plan: Plan, sent: list[figures.Replayed]
) -> tuple[figures.Setting, list[dict[str, Any]]]:
    """A replay's figures against its own log (``log``; None: a server at a URL, whose log is not
    at hand), and the late tokens of its requests that log names (``replay_stalls``)."""
    new = read_replayed(log) if log is not None else None
    by_trace = {r["traceparent"]: r for r in new.requests} if new is not None else {}
    rows, ids = [], {}
    for x in sent:
        served = by_trace.get(x.traceparent)
        rows.append(figures.replayed_row(name, plan.recorded[x.index], x, served))
        if served is not None and served.get("id") is not None:
            ids[str(served["id"])] = str(plan.recorded[x.index].get("id"))
    gaps = [x.gaps_ns for x in sent]
    peaks = new.peaks if new is not None else {}
    span = figures.replayed_span(sent)
    logged = str(log) if log is not None else None
    late = replay_stalls.stalls(name, log, new.sid, ids) if log is not None and new else []
    return figures.Setting(name, rows, gaps, span, peaks, logged), late


def _one(
    name: str,
    args: tuple[str, ...],
    log: Path,
    request: ReplayRequest,
    plan: Plan,
    progress: Progress,
    say: Callable[[str], None],
) -> tuple[figures.Setting, Path, list[dict[str, Any]]]:
    """One replay: its server started (unless ``url``), every request sent, the server stopped;
    its figures against its own log, the responses file, its stalls."""
    folder = MediaFolder(request.media)
    responses = log.with_name(log.name + ".responses.jsonl")
    try:
        f = open(responses, "wb")  # closed below, after the server has stopped
    except OSError as exc:
        raise UserError(f"cannot write {responses}: {exc.strerror or exc}") from None
    try:
        with contextlib.ExitStack() as stack:
            stack.callback(f.close)
            server = None if request.url else stack.enter_context(servers.serving(args, log, say))
            tick = stack.enter_context(progress(name, len(plan.sends)))
            url = server.url if server is not None else str(request.url)
            watch = server.gone if server is not None else (lambda: None)
            key = server.key if server is not None else request.api_key
            sent = send_all(url, plan, folder, _writer(f, plan, tick), watch, key)
    except BaseException:
        # a replay that ended before any answer (its server never started) leaves no empty file;
        # one that ended mid-way keeps the answers it had
        if responses.stat().st_size == 0:
            responses.unlink()
        raise
    if server is not None and not log.is_file():
        said = f": {server.note}" if server.note else ""
        raise UserError(f"{servers.PROGRAM} wrote no session log at {log}{said}")
    setting, late = _against_log(name, log if server is not None else None, plan, sent)
    return setting, responses, late


def replay(
    request: ReplayRequest,
    say: Callable[[str], None] = lambda _: None,
    progress: Progress = no_progress,
) -> ReplayResult:
    """Replay the recorded requests under each setting (see ``ReplayRequest``); ``say`` hears
    where each log goes, ``progress`` each request end. A log without bodies, or nothing to send,
    is a one-line error; a server that ends before its replay is done, ``server.ServerGone``."""
    if (request.url is None) == (not request.server_args):
        raise UserError("give llama-server's arguments after --, or --url of a running server")
    if request.url is not None and request.settings:
        raise UserError("--set starts a server per setting: it cannot change one at --url")
    if request.url is None and request.api_key is not None:
        raise UserError(
            "--api-key is --url's: a server the replay starts takes its key from its own "
            "arguments (-- llama-server ... --api-key K, or --api-key-file F)"
        )
    served = read_served(request.log, request.selection)
    plan = make_plan(str(request.log), served.requests, request.speed, MediaFolder(request.media))
    if not plan.sends:
        told = ", ".join(f"{v} {k}" for k, v in plan.skipped.most_common())
        raise UserError(f"{request.log}: no request to replay ({told or 'none selected'})")
    recorded = figures.Setting(
        figures.RECORDED,
        [figures.recorded_row(r) for r in plan.recorded],
        span_ns=figures.recorded_span(plan.recorded),
        peaks=served.peaks,
        log=str(request.log),
    )
    result = ReplayResult(request.log, request.speed, request.slo, [recorded], [], plan.skipped)
    result.session_requests = served.total
    sent_ids = {str(r.get("id")) for r in plan.recorded}
    result.stalls[figures.RECORDED] = replay_stalls.stalls(
        figures.RECORDED, request.log, served.sid, None, sent_ids
    )
    for name, args, log in _runs(request):
        setting, responses, late = _one(name, args, log, request, plan, progress, say)
        result.settings.append(setting)
        result.responses.append(responses)
        if setting.log is not None:
            result.stalls[name] = late
    result.summaries = [figures.summary(s, request.slo) for s in result.settings]
    return result
