"""The replay's client: every request of a plan sent at its time (open loop: a request never waits
for another's answer; one connection per request in flight), streamed where it streamed, each
timed as a client sees it: when it was sent, its first chunk of generated text, every gap between
two chunks, its end.

asyncio with httpcore (httpx's transport, without its client's layers: a request's URL merging,
cookies, redirects and hooks cost a quarter of the client's time per request, on 2 cores about
0.3 ms): a request is a task started at its time, and a watcher ends the replay as soon as the
server is gone (``watch`` says why), so that a dead server costs one line, not a timeout per
request."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import httpcore
import orjson

from llamacpp_instr.converters.session.replay_figures import Replayed
from llamacpp_instr.converters.session.replay_match import traceparent

from . import responses
from .media import MediaFolder, inflate
from .plan import Plan, ToSend
from .server import ServerGone

# how long a request may go without a byte from the server, and how often the watcher looks
READ_TIMEOUT_S = 600.0
WATCH_S = 0.2
TIMEOUTS = {"timeout": {"connect": 30.0, "read": READ_TIMEOUT_S, "write": READ_TIMEOUT_S}}
# what a request that got no answer raised
FAILED = (
    httpcore.NetworkError,
    httpcore.TimeoutException,
    httpcore.ProtocolError,
    httpcore.UnsupportedProtocol,
    OSError,
)

# what the client hears of each request done: its figures and the text it got
Done = Callable[[Replayed, str], None]


def _body(send: ToSend, folder: MediaFolder) -> bytes:
    """The body to send: the recorded one, its media put back from their files."""
    if not send.media:
        return send.body
    body = orjson.loads(send.body)
    found = folder.resolve(body)
    if found is None:  # (a file gone since the plan was made)
        raise OSError("a medium of the request is no longer at hand")
    return orjson.dumps(inflate(body, found))


class _Stream:
    """A response read chunk by chunk: the chunks with generated text timed from ``start``."""

    def __init__(self, out: Replayed, start: int) -> None:
        self.out, self.start, self.last = out, start, 0
        self.text: list[str] = []
        self.size = 0

    def chunk(self, obj: Any, now: int) -> None:
        out = self.out
        out.error = out.error or responses.error_of(obj)
        t = responses.timings(obj)
        if t is not None:
            out.timings = t
        n = responses.output_tokens(obj, t)
        out.n_out = n if n is not None else out.n_out
        text = responses.generated_text(obj)
        if not text:
            return
        if out.chunks == 0:
            out.ttft_ns = now - self.start
        else:
            out.gaps_ns.append(now - self.last)
        self.last = now
        out.chunks += 1
        if self.size < responses.TEXT_MAX:
            self.text.append(text[: responses.TEXT_MAX - self.size])
            self.size += len(self.text[-1])


class _Client:
    """The connections to one server (one per request in flight, up to 32 kept for the next) and
    the headers every request carries."""

    def __init__(self, url: str, key: str | None) -> None:
        self.url = url.rstrip("/")
        self.pool = httpcore.AsyncConnectionPool(max_connections=None, max_keepalive_connections=32)
        self.headers = [(b"Content-Type", b"application/json")]
        if key:
            self.headers.append((b"Authorization", f"Bearer {key}".encode()))

    def send(self, endpoint: str, body: bytes, out: Replayed) -> Any:
        headers = [*self.headers, (b"traceparent", out.traceparent.encode())]
        return self.pool.stream(
            "POST", self.url + endpoint, headers=headers, content=body, extensions=TIMEOUTS
        )


async def _lines(r: httpcore.Response) -> Any:
    """The response's lines as text, as they arrive (\n or \r\n ended)."""
    rest = b""
    async for chunk in r.aiter_stream():
        rest += chunk
        *lines, rest = rest.split(b"\n")
        for line in lines:
            yield line.rstrip(b"\r").decode("utf-8", "replace")
    if rest:
        yield rest.rstrip(b"\r").decode("utf-8", "replace")


async def _streamed(client: _Client, send: ToSend, body: bytes, out: Replayed) -> str:
    start = time.perf_counter_ns()
    read = _Stream(out, start)
    async with client.send(send.endpoint, body, out) as r:
        out.status = r.status
        if r.status >= 300:
            out.error = responses.error_of(_json(await r.aread()))
        else:
            async for line in _lines(r):
                data = responses.sse_data(line)
                if data is None or data == "[DONE]":
                    continue
                read.chunk(_json(data.encode()), time.perf_counter_ns())
    out.e2e_ns = time.perf_counter_ns() - start
    if out.n_out is None and out.chunks:
        out.n_out = out.chunks
    return "".join(read.text)


async def _whole(client: _Client, send: ToSend, body: bytes, out: Replayed) -> str:
    start = time.perf_counter_ns()
    async with client.send(send.endpoint, body, out) as r:
        content = await r.aread()
    out.e2e_ns = time.perf_counter_ns() - start
    out.status = r.status
    obj = _json(content)
    out.error = responses.error_of(obj)
    out.timings = responses.timings(obj)
    out.n_out = responses.output_tokens(obj, out.timings)
    return responses.generated_text(obj)[: responses.TEXT_MAX]


def _json(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


async def _one(
    client: _Client, send: ToSend, folder: MediaFolder, out: Replayed, done: Done
) -> None:
    text = ""
    try:
        body = _body(send, folder)
        text = await (_streamed if send.stream else _whole)(client, send, body, out)
        if out.status >= 300 and out.error is None:
            out.error = f"HTTP {out.status}"
    except FAILED as exc:
        out.error = f"{type(exc).__name__}: {exc}"[:200]
    done(out, text)


async def _dispatch(
    url: str, plan: Plan, folder: MediaFolder, run: int, done: Done, key: str | None
) -> list[Replayed]:
    client = _Client(url, key)
    sent: list[Replayed] = []
    # (no proxy of the environment's is ever between a replay and its server: httpcore reads none)
    async with client.pool:
        # a first exchange, untimed: the client's own first-use costs are none of a request's
        with contextlib.suppress(*FAILED):
            async with client.pool.stream("GET", client.url + "/health", extensions=TIMEOUTS) as r:
                await r.aread()
        start = time.perf_counter_ns()
        tasks = []
        for send in plan.sends:
            delay = (start + send.at_ns - time.perf_counter_ns()) / 1e9
            if delay > 0:
                await asyncio.sleep(delay)
            out = Replayed(send.index, traceparent(run, send.index))
            out.sent_ns = time.perf_counter_ns() - start
            sent.append(out)
            tasks.append(asyncio.create_task(_one(client, send, folder, out, done)))
        await asyncio.gather(*tasks)
    return sent


async def _watched(
    url: str,
    plan: Plan,
    folder: MediaFolder,
    done: Done,
    watch: Callable[[], str | None],
    key: str | None,
) -> list[Replayed]:
    run = time.time_ns()  # (the replay's traces: another replay's are other ids)
    main = asyncio.create_task(_dispatch(url, plan, folder, run, done, key))

    async def watcher() -> str:
        while (why := watch()) is None:
            await asyncio.sleep(WATCH_S)
        return why

    guard = asyncio.create_task(watcher())
    await asyncio.wait({main, guard}, return_when=asyncio.FIRST_COMPLETED)
    if main.done():
        guard.cancel()
        return main.result()
    main.cancel()
    await asyncio.gather(main, return_exceptions=True)
    raise ServerGone(guard.result())


def send_all(
    url: str,
    plan: Plan,
    folder: MediaFolder,
    done: Done,
    watch: Callable[[], str | None],
    key: str | None = None,
) -> list[Replayed]:
    """Send every request of ``plan`` to ``url`` at its time (with ``key``, each carries
    ``Authorization: Bearer KEY``), each answer's figures and text to ``done`` as it ends;
    ``watch`` is asked, every WATCH_S, why the server is gone (None while it is not): then
    ``ServerGone`` with that reason. The figures, in the plan's order."""
    return asyncio.run(_watched(url, plan, folder, done, watch, key))
