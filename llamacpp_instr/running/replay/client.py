"""The replay's client: every request of a plan sent at its time (open loop: a request never waits
for another's answer; one connection per request in flight), streamed where it streamed, each
timed as a client sees it: when it was sent, its first chunk of generated text, every gap between
two chunks, its end.

asyncio with httpx: a request is a task started at its time, and a watcher ends the replay as soon
as the server is gone (``watch`` says why), so that a dead server costs one line, not a timeout per
request."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import httpx
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


async def _streamed(client: httpx.AsyncClient, send: ToSend, body: bytes, out: Replayed) -> str:
    start = time.perf_counter_ns()
    read = _Stream(out, start)
    headers = {"Content-Type": "application/json", "traceparent": out.traceparent}
    async with client.stream("POST", send.endpoint, content=body, headers=headers) as r:
        out.status = r.status_code
        if r.status_code >= 300:
            out.error = responses.error_of(_json(await r.aread()))
        else:
            async for line in r.aiter_lines():
                data = responses.sse_data(line)
                if data is None or data == "[DONE]":
                    continue
                read.chunk(_json(data.encode()), time.perf_counter_ns())
    out.e2e_ns = time.perf_counter_ns() - start
    if out.n_out is None and out.chunks:
        out.n_out = out.chunks
    return "".join(read.text)


async def _whole(client: httpx.AsyncClient, send: ToSend, body: bytes, out: Replayed) -> str:
    start = time.perf_counter_ns()
    headers = {"Content-Type": "application/json", "traceparent": out.traceparent}
    r = await client.post(send.endpoint, content=body, headers=headers)
    out.e2e_ns = time.perf_counter_ns() - start
    out.status = r.status_code
    obj = _json(r.content)
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
    client: httpx.AsyncClient, send: ToSend, folder: MediaFolder, out: Replayed, done: Done
) -> None:
    text = ""
    try:
        body = _body(send, folder)
        text = await (_streamed if send.stream else _whole)(client, send, body, out)
        if out.status >= 300 and out.error is None:
            out.error = f"HTTP {out.status}"
    except (httpx.HTTPError, OSError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"[:200]
    done(out, text)


async def _dispatch(
    url: str, plan: Plan, folder: MediaFolder, run: int, done: Done, key: str | None
) -> list[Replayed]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=32)
    timeout = httpx.Timeout(READ_TIMEOUT_S, connect=30.0)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    sent: list[Replayed] = []
    # (trust_env off: a proxy the environment names is never between a replay and its server)
    async with httpx.AsyncClient(
        base_url=url, limits=limits, timeout=timeout, trust_env=False, headers=headers
    ) as client:
        # a first exchange, untimed: the client's own first-use costs are none of a request's
        with contextlib.suppress(httpx.HTTPError):
            await client.get("/health")
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
