"""A session log's figures as Prometheus metrics (``instr follow --prometheus``), with ``prometheus-client``.

Names and buckets are vLLM's where vLLM has the metric (``vllm/v1/metrics/loggers.py``), under
our own prefix, so that a vLLM dashboard's queries carry over with the prefix changed. The
figures come from the log (``live_figures``), never from the server: a scrape reads this
process's counters and touches neither the decoding process nor its model (llama-server's own
/metrics runs in its task loop, and a scrape there can wake a sleeping model).

Where the log says less than vLLM's metric would:

* requests are counted by the record's ``outcome`` (ok, error, cancelled), not by a finish reason
  (stop or length), which the record does not hold;
* ``generation_tokens`` counts the generated tokens decoded (the record's ``gen_tokens``: each
  fed back to the model, so one fewer than sampled per request);
* ``kv_cache_usage_perc`` is served only for a context of one sequence: ``step_end.kv_used`` is
  sequence 0's span of cells, which is the whole cache's use only then (``kv_cells_used`` serves
  it always);
* the prompt cache's hits are the prompt tokens a request's first step did not decode (its first
  position), its queries those plus the prompt tokens it decoded.
"""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest

from ..reading.decode.host import OTHER as OTHER_SAMPLER
from ..reading.decode.host import PIN_SAMPLERS, SAMPLING_PARTS
from .live_figures import (
    EncodeFigures,
    Figures,
    HostFigures,
    RequestFigures,
    SessionFigures,
    StepFigures,
)
from .log_input import MISS_REASONS

PREFIX = "llamacpp_instr:"

# vLLM's buckets (vllm/v1/metrics/loggers.py)
TTFT_BUCKETS = [
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
] + [10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0]
ITL_BUCKETS += [7.5, 10.0, 20.0, 40.0, 80.0]
REQUEST_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0]
REQUEST_LATENCY_BUCKETS += [50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
ITERATION_TOKENS_BUCKETS: list[float] = [
    1,
    8,
    16,
    32,
    64,
    128,
    256,
    512,
    1024,
    2048,
    4096,
    8192,
    16384,
]
# ours: one decode step of a small model on a CPU takes milliseconds
STEP_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0]
STEP_BUCKETS += [10.0]
# ours: a token's sampling, from a greedy pick on a small vocabulary (microseconds) to a grammar's
# full pass on a large one (tens of milliseconds)
SAMPLING_BUCKETS = [1e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3]
SAMPLING_BUCKETS += [0.01, 0.025, 0.05, 0.1, 0.25]
# the sampler label's values: the pin's samplers, the grammar's passes, the rest of the sampling
SAMPLER_LABELS = ("total", *PIN_SAMPLERS, *SAMPLING_PARTS, OTHER_SAMPLER)
DEFAULT_MAX_MODEL_LEN = 2048  # the token histograms' range before a session_start says n_ctx
OUTCOMES = ("ok", "error", "cancelled")  # a request record's outcome
KINDS = ("prompt", "gen")  # a step's kind
OTHER = "other"  # the label of a value the writer does not emit (a label's series stay bounded)


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (vLLM's buckets for token counts)."""
    out: list[int] = []
    exponent = 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exponent
            if v > max_value:
                return out
            out.append(v)
        exponent += 1


class Families:
    """The metric families of one log, defined in their own registry."""

    def __init__(self) -> None:
        # the ``_created`` series of every counter and histogram: noise for these dashboards
        prometheus_client.disable_created_metrics()
        self.registry = CollectorRegistry()
        r = self.registry
        # the exporter's own process: its memory stays bounded (process_resident_memory_bytes)
        prometheus_client.ProcessCollector(registry=r)

        self._histograms(r)
        self._counters(r)
        self._gauges(r)

    def _histograms(self, r: CollectorRegistry) -> None:
        def hist(
            name: str, doc: str, buckets: list[float], labels: tuple[str, ...] = ()
        ) -> Histogram:
            return Histogram(PREFIX + name, doc, labels, buckets=buckets, registry=r)

        self.ttft = hist(
            "time_to_first_token_seconds",
            "Time from a request's arrival to its first token.",
            TTFT_BUCKETS,
        )
        self.itl = hist(
            "inter_token_latency_seconds",
            "Time between a request's successive tokens (from the steps that served it).",
            ITL_BUCKETS,
        )
        self.e2e = hist(
            "e2e_request_latency_seconds",
            "Time from a request's arrival until its response was complete.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.queue = hist(
            "request_queue_time_seconds",
            "Time from a request's arrival until a slot started its prompt.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.inference = hist(
            "request_inference_time_seconds",
            "Time a request held the model (its slot).",
            REQUEST_LATENCY_BUCKETS,
        )
        self.prefill = hist(
            "request_prefill_time_seconds",
            "Time from a request getting the model to its first token.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.decode = hist(
            "request_decode_time_seconds",
            "Time from a request's first token until it let the model go.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.iteration_tokens = hist(
            "iteration_tokens_total",
            "Tokens in a decode step's batch.",
            ITERATION_TOKENS_BUCKETS,
        )
        self.step = hist(
            "step_duration_seconds",
            "Time in llama_decode per decode step, by the step's kind (prompt: a batch of more "
            "than one token; gen: one token).",
            STEP_BUCKETS,
            ("kind",),
        )
        self.encode = hist(
            "encode_duration_seconds",
            "Time per encode of an image's or a sound's slices by its encoder (mtmd), from its "
            "graph's build to its embeddings copied out: never a decode step's.",
            STEP_BUCKETS,
        )
        self.sampling = hist(
            "sampling_time_per_token_seconds",
            "Sampling time per token sampled, by sampler: total (the sampling of each token end "
            "to end, at every level), and at --level detailed each of the pin's samplers, "
            "grammar (its passes outside the chain), candidates, chain, other.",
            SAMPLING_BUCKETS,
            ("sampler",),
        )
        self._token_hists: tuple[Histogram, Histogram] | None = None
        self._step_by_kind: dict[str, Histogram] = {}

    def _counters(self, r: CollectorRegistry) -> None:
        self.requests = Counter(
            PREFIX + "requests",
            "Requests done, by outcome: ok, error (an HTTP error status, or an error mid-stream) "
            "or cancelled (the client went away first).",
            ("outcome",),
            registry=r,
        )
        for outcome in OUTCOMES:  # each series from 0, so that rate() sees the first request
            self.requests.labels(outcome)
        self.success = Counter(
            PREFIX + "request_success", "Requests done with outcome ok.", registry=r
        )
        self.prompt_tokens = Counter(
            PREFIX + "prompt_tokens", "Prompt tokens decoded for requests.", registry=r
        )
        self.gen_tokens = Counter(
            PREFIX + "generation_tokens", "Generated tokens decoded for requests.", registry=r
        )
        self.cache_queries = Counter(
            PREFIX + "prefix_cache_queries",
            "Prompt tokens of requests that reached a slot (those its cache held and those "
            "decoded).",
            registry=r,
        )
        self.cache_hits = Counter(
            PREFIX + "prefix_cache_hits",
            "Prompt tokens a slot's cache held for its request (not decoded again).",
            registry=r,
        )
        self.cache_misses = Counter(
            PREFIX + "prompt_cache_misses",
            "Requests whose prompt reused less than a cache held, by why (instr requests): "
            + ", ".join(k for k in MISS_REASONS if k != "new")
            + "; new: no cache held a useful part of it.",
            ("reason",),
            registry=r,
        )

    def _gauges(self, r: CollectorRegistry) -> None:
        self.running = Gauge(
            PREFIX + "num_requests_running",
            "Busy slots: sequences that have decoded since their last request ended.",
            registry=r,
        )
        self.kv_used = Gauge(
            PREFIX + "kv_cells_used",
            "KV cache cells in use after the last step (sequence 0's span, step_end.kv_used).",
            registry=r,
        )
        self.kv_total = Gauge(
            PREFIX + "kv_cells_total", "KV cache cells the context allocated (n_ctx).", registry=r
        )
        self.kv_usage = Gauge(
            PREFIX + "kv_cache_usage_perc",
            "KV cache usage, 1 is full (served for a context of one sequence only).",
            registry=r,
        )
        self.reuse = Gauge(
            PREFIX + "prompt_cache_reuse_ratio",
            "Of the prompt tokens of requests, the share the slots' caches held (hits/queries).",
            registry=r,
        )
        self.memory = Gauge(
            PREFIX + "memory_bytes",
            "Memory the session's buffers hold, by buffer type and use (weights, kv_cache, "
            "compute), as the session began.",
            ("buffer", "kind"),
            registry=r,
        )
        self.info = Gauge(
            PREFIX + "session_info",
            "The session being read: 1, with its id, level, model and program as labels.",
            ("sid", "level", "model", "program"),
            registry=r,
        )


class Metrics(Families):
    """The metrics of one log, updated by ``observe``."""

    def __init__(self) -> None:
        super().__init__()
        self._hits = 0
        self._queries = 0
        self._n_cells: int | None = None
        self._one_seq = False

    def observe(self, fig: Figures | None) -> None:
        if isinstance(fig, StepFigures):
            self._step(fig)
        elif isinstance(fig, EncodeFigures):  # an encoder's, not a decode step
            self.encode.observe(fig.dur_s)
        elif isinstance(fig, HostFigures):
            for name, seconds, n in fig.per_token:
                h = self.sampling.labels(name if name in SAMPLER_LABELS else OTHER_SAMPLER)
                for _ in range(n):
                    h.observe(seconds)
        elif isinstance(fig, RequestFigures):
            self._request(fig)
        elif isinstance(fig, SessionFigures):
            self._session(fig)

    def _session(self, s: SessionFigures) -> None:
        self._token_histograms(s.n_ctx)
        if s.continued:
            return
        self.info.clear()
        self.info.labels(s.sid, s.level, s.model, s.program).set(1)
        self.memory.clear()
        for buffer, kind, n in s.memory:
            self.memory.labels(buffer, kind).set(n)
        self._n_cells = s.n_ctx
        if s.n_ctx:
            self.kv_total.set(s.n_ctx)
        self._one_seq = s.n_seq_max == 1
        self.running.set(0)

    def _token_histograms(self, n_ctx: int | None) -> tuple[Histogram, Histogram]:
        """The histograms of tokens per request, made at the first session_start (their buckets
        reach the context's size, as vLLM's reach the model's length)."""
        if self._token_hists is None:
            top = build_1_2_5_buckets(n_ctx or DEFAULT_MAX_MODEL_LEN)
            self._token_hists = (
                Histogram(
                    PREFIX + "request_prompt_tokens",
                    "Prompt tokens a request decoded (after the prompt cache).",
                    buckets=top,
                    registry=self.registry,
                ),
                Histogram(
                    PREFIX + "request_generation_tokens",
                    "Generated tokens a request decoded.",
                    buckets=top,
                    registry=self.registry,
                ),
            )
        return self._token_hists

    def _step(self, s: StepFigures) -> None:
        kind = s.kind if s.kind in KINDS else OTHER
        by_kind = self._step_by_kind.get(kind)
        if by_kind is None:
            by_kind = self._step_by_kind[kind] = self.step.labels(kind)
        by_kind.observe(s.dur_s)
        self.iteration_tokens.observe(s.n_tokens)
        self.running.set(s.running)
        if s.kv_used is not None:
            self.kv_used.set(s.kv_used)
            if self._one_seq and self._n_cells:
                self.kv_usage.set(s.kv_used / self._n_cells)

    def _request(self, q: RequestFigures) -> None:
        self.requests.labels(q.outcome if q.outcome in OUTCOMES else OTHER).inc()
        if q.outcome == "ok":
            self.success.inc()
        for h, v in (
            (self.ttft, q.ttft_s),
            (self.e2e, q.e2e_s),
            (self.queue, q.queue_s),
            (self.inference, q.inference_s),
            (self.prefill, q.prefill_s),
            (self.decode, q.decode_s),
        ):
            if v is not None:
                h.observe(v)
        for gap in q.itl_s:
            self.itl.observe(gap)
        self.prompt_tokens.inc(q.prompt_tokens)
        self.gen_tokens.inc(q.gen_tokens)
        prompt, gen = self._token_histograms(None)
        prompt.observe(q.prompt_tokens)
        gen.observe(q.gen_tokens)
        if q.cache_miss is not None:
            self.cache_misses.labels(q.cache_miss).inc()
        if q.cached_tokens is not None:
            self.cache_hits.inc(q.cached_tokens)
            self.cache_queries.inc(q.cached_tokens + q.prompt_tokens)
            self._hits += q.cached_tokens
            self._queries += q.cached_tokens + q.prompt_tokens
            if self._queries:
                self.reuse.set(self._hits / self._queries)
        self.running.set(q.running)


class _MetricsHandler(BaseHTTPRequestHandler):
    """GET /metrics: the registry in Prometheus' classic text format (0.0.4), whatever the
    scraper's Accept header offers. prometheus-client's OpenMetrics writer (0.26) turns the
    colons of sample names into underscores while the TYPE lines keep them: Prometheus would
    store ``llamacpp_instr_...``, and no vLLM-style query would find the metrics."""

    registry: CollectorRegistry

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path.split("?")[0] not in ("/metrics", "/"):
            self.send_error(404, "only /metrics here")
            return
        body = generate_latest(self.registry)
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE_PLAIN_0_0_4)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # a line per scrape is noise


def serve_http(sock: socket.socket, registry: CollectorRegistry) -> ThreadingHTTPServer:
    """Serve ``registry`` at ``/metrics`` on the bound, listening ``sock``, from a daemon thread;
    returns the server (``shutdown()`` stops it)."""
    handler = type("Handler", (_MetricsHandler,), {"registry": registry})
    server = ThreadingHTTPServer(sock.getsockname()[:2], handler, bind_and_activate=False)
    server.socket.close()
    server.socket = sock
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server
