"""ctypes bindings to the ``llama_instr_*`` C API (include/llama-instr.h), from the very library
handle llama_cpp loaded."""

from __future__ import annotations

import ctypes
import json
import os
from dataclasses import dataclass
from typing import Any

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.contract.schema import LEVEL_IDS, LEVELS
from llamacpp_instr.native import pin

_STOCK_HINT = "run `instr build` to build and install the patched llama-cpp-python"

# enum llama_instr_status
OK = 0
ERR_BUSY = -1
ERR_NO_SESSION = -2
ERR_INVALID_ARG = -3
ERR_IO = -4
ERR_INTERNAL = -5


class SessionError(UserError):
    """The C API reported a failure; ``code`` is its llama_instr_status."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class Totals(ctypes.Structure):
    """struct llama_instr_totals."""

    _fields_ = [
        ("n_steps", ctypes.c_int64),
        ("n_tokens", ctypes.c_int64),
        ("n_prompt_tokens", ctypes.c_int64),
        ("n_gen_tokens", ctypes.c_int64),
        ("n_computes", ctypes.c_int64),
        ("n_records", ctypes.c_int64),
        ("n_lost", ctypes.c_int64),
    ]


class ProbeTensor(ctypes.Structure):
    """struct llama_instr_probe_tensor."""

    _fields_ = [
        ("type", ctypes.c_int32),
        ("ne", ctypes.c_int64 * 4),
        ("nbytes", ctypes.c_int64),
    ]


class ProbeAttn(ctypes.Structure):
    """struct llama_instr_probe_attn: an attention probe's op and shapes."""

    _fields_ = [
        ("op", ctypes.c_int32),
        ("type_k", ctypes.c_int32),
        ("type_v", ctypes.c_int32),
        ("head_dim_k", ctypes.c_int32),
        ("head_dim_v", ctypes.c_int32),
        ("n_head", ctypes.c_int32),
        ("n_head_kv", ctypes.c_int32),
        ("n_layer", ctypes.c_int32),
        ("kv_size", ctypes.c_int64),
        ("n_kv", ctypes.c_int64),
        ("pos0", ctypes.c_int64),
    ]


class Probe(ctypes.Structure):
    """struct llama_instr_probe: one peak measurement (inputs, then outputs)."""

    _fields_ = [
        ("kind", ctypes.c_int32),
        ("device", ctypes.c_int32),
        ("type", ctypes.c_int32),
        ("n_threads", ctypes.c_int32),
        ("size", ctypes.c_int64),
        ("n", ctypes.c_int64),
        ("n_runs", ctypes.c_int32),
        ("attn", ProbeAttn),
        ("m", ctypes.c_int64),
        ("n_weights", ctypes.c_int32),
        ("n_threads_b", ctypes.c_int32),
        ("device_name", ctypes.c_char * 64),
        ("buffer_type", ctypes.c_char * 64),
        ("n_tensors", ctypes.c_int32),
        ("tensors", ProbeTensor * 3),
        ("bytes", ctypes.c_int64),
        ("flops", ctypes.c_int64),
        ("best_ns", ctypes.c_int64),
        ("total_ns", ctypes.c_int64),
        ("best_ns_b", ctypes.c_int64),
        ("total_ns_b", ctypes.c_int64),
        ("median_ns", ctypes.c_int64),
        ("median_ns_b", ctypes.c_int64),
        ("error", ctypes.c_char * 256),
    ]


# enum llama_instr_probe_kind
PROBE_BANDWIDTH = 0
PROBE_MATMUL = 1
PROBE_ATTENTION = 2
# enum llama_instr_probe_attn_op
ATTN_FLASH, ATTN_KQ, ATTN_SOFTMAX, ATTN_KQV = 0, 1, 2, 3


def import_llama_cpp() -> Any:
    """``llama_cpp``, or a one-line UserError saying how to get it."""
    try:
        import llama_cpp
    except ImportError as exc:
        raise UserError(f"llama_cpp is not installed ({exc}); {_STOCK_HINT}") from None
    except OSError as exc:  # the shared library failed to load
        raise UserError(
            f"llama_cpp's native library failed to load ({exc}); {_STOCK_HINT}"
        ) from None
    return llama_cpp


def _json(obj: dict[str, Any], what: str) -> bytes:
    """``obj`` as the C API takes it: strict JSON (NaN and infinities are not JSON: the library
    refuses them), ASCII, on one line."""
    try:
        return json.dumps(obj, ensure_ascii=True, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise UserError(f"{what} must be JSON-serializable (no NaN or infinity): {exc}") from None


class MachineEntries:
    """The machine and its peaks (llama-instr-peaks.cpp): what this machine is, as session_start
    records it, and one peak measurement at a time (``llama_instr_probe_run``)."""

    lib: ctypes.CDLL

    def machine_info(self) -> dict[str, Any]:
        """This machine as session_start records it: CPU model, hardware threads, devices."""
        raw = self.lib.llama_instr_machine_info().decode(errors="replace")
        if not raw:
            raise SessionError("llama_instr_machine_info failed", ERR_INTERNAL)
        info: dict[str, Any] = json.loads(raw)
        return info

    def probe(
        self,
        kind: int,
        device: int,
        type_id: int,
        n_threads: int,
        size: int,
        n: int,
        n_runs: int,
        attn: ProbeAttn | None = None,
        m: int = 0,
        n_weights: int = 0,
        n_threads_b: int = 0,
    ) -> Probe:
        """Run one measurement (llama_instr_probe_run); a SessionError saying why if the device
        cannot run it. ``attn``: an ATTENTION probe's op and shapes; ``m``, ``n_weights``,
        ``n_threads_b``: a MATMUL's weight rows (0: ``size``), how many such weights it runs (0:
        one), and a second CPU thread count timed in turn with ``n_threads`` (0: none)."""
        p = Probe(kind=kind, device=device, type=type_id, n_threads=n_threads, size=size, n=n)
        p.n_runs = n_runs
        p.m, p.n_weights, p.n_threads_b = m, n_weights, n_threads_b
        if attn is not None:
            p.attn = attn
        rc = int(self.lib.llama_instr_probe_run(ctypes.byref(p)))
        if rc < 0:
            raise SessionError(p.error.decode(errors="replace") or f"probe failed ({rc})", rc)
        return p


class TestingEntries:
    """The testing build's entry points (llama-instr-testing.h, llama-instr-bench.h: `instr build
    --testing`): allocation failures on purpose, the registries' counts, steps deferred or
    delayed, the overhead benchmark's eval callback; each a one-line UserError in another build."""

    lib: ctypes.CDLL

    def _testing_only(self, name: str) -> Any:
        fn = getattr(self.lib, name, None)
        if fn is None:
            raise UserError(
                f"{name} is only in the testing build (`instr build --testing`, run with the "
                "LLAMA_CPP_LIB_PATH it prints)"
            )
        return fn

    @property
    def bench_cb_eval(self) -> int:
        """Address of the native upstream-style cb_eval (the overhead benchmark's peer; testing
        build only)."""
        fn = self._testing_only("llama_instr_bench_cb_eval")
        return ctypes.cast(fn, ctypes.c_void_p).value or 0

    def bench_cb_eval_count(self) -> int:
        fn = self._testing_only("llama_instr_bench_cb_eval_count")
        fn.restype = ctypes.c_int64
        return int(fn())

    def test_fail_alloc(self, n: int) -> None:
        """Fail the n-th allocation made on behalf of llama_instr code from now on (0 disarms;
        testing build only)."""
        fn = self._testing_only("llama_instr_test_fail_alloc")
        fn.argtypes = [ctypes.c_int64]
        fn.restype = None
        fn(n)

    def test_failed_allocs(self) -> int:
        """Allocations failed on purpose since the last test_fail_alloc (testing build only)."""
        fn = self._testing_only("llama_instr_test_failed_allocs")
        fn.restype = ctypes.c_int64
        return int(fn())

    def test_memory_caches(self) -> int:
        """KV caches and recurrent states the memory table knows now (testing build only)."""
        fn = self._testing_only("llama_instr_test_memory_caches")
        fn.restype = ctypes.c_int64
        return int(fn())

    def test_ctx_states(self) -> int:
        """Contexts that have a state in the registry now (testing build only)."""
        fn = self._testing_only("llama_instr_test_ctx_states")
        fn.restype = ctypes.c_int64
        return int(fn())

    def test_defer_steps(self, on: bool) -> None:
        """Every step's records wait for the host's next synchronization of its context, as a
        step with CUDA marks to read does (testing build only)."""
        fn = self._testing_only("llama_instr_test_defer_steps")
        fn.argtypes = [ctypes.c_int32]
        fn.restype = None
        fn(1 if on else 0)

    def test_async_devices(self, on: bool) -> None:
        """The devices of schedulers made from now on are taken for asynchronous ones, as if
        the CPU were a GPU (testing build only)."""
        fn = self._testing_only("llama_instr_test_async_devices")
        fn.argtypes = [ctypes.c_int32]
        fn.restype = None
        fn(1 if on else 0)

    def test_write_delay(self, us: int) -> None:
        """Each deferred step's writing takes ``us`` microseconds longer: a slow disk's stand-in
        (testing build only)."""
        fn = self._testing_only("llama_instr_test_write_delay")
        fn.argtypes = [ctypes.c_int64]
        fn.restype = None
        fn(us)

    def test_last_op_ns(self, n_threads: int, slow_ns: int) -> int:
        """The CPU profiler's duration of a graph's last op whose threads other than thread 0
        work ``slow_ns`` longer (testing build only)."""
        fn = self._testing_only("llama_instr_test_last_op_ns")
        fn.argtypes = [ctypes.c_int32, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)]
        fn.restype = ctypes.c_int32
        out = ctypes.c_int64()
        rc = int(fn(n_threads, slow_ns, ctypes.byref(out)))
        if rc != 0:
            raise SessionError(f"llama_instr_test_last_op_ns failed ({rc})", rc)
        return int(out.value)


@dataclass
class InstrLib(MachineEntries, TestingEntries):
    """The instrumentation functions of the loaded libllama: a session's here, the machine's and
    the testing build's in their own classes."""

    lib: ctypes.CDLL

    def build_info(self) -> dict[str, Any]:
        info: dict[str, Any] = json.loads(self.lib.llama_instr_build_info().decode())
        return info

    def last_error(self) -> str:
        return str(self.lib.llama_instr_last_error().decode(errors="replace"))

    def _check(self, rc: int, what: str) -> int:
        if rc < 0:
            raise SessionError(self.last_error() or f"{what} failed ({rc})", rc)
        return rc

    def session_begin(self, ctx: Any, path: str, level: str, metadata: dict[str, Any]) -> None:
        meta = _json(metadata, "metadata")
        rc = self.lib.llama_instr_session_begin(ctx, path.encode(), LEVEL_IDS[level], meta)
        if rc == ERR_BUSY and os.environ.get("LLAMA_INSTR_LOG"):
            # libllama opened the process's one session itself, at the first context
            raise SessionError(
                "a session is already open: LLAMA_INSTR_LOG is set, so the whole process is "
                f"logged to {os.environ['LLAMA_INSTR_LOG']} (unset it to open sessions here)",
                rc,
            )
        self._check(rc, "llama_instr_session_begin")

    def session_end(self, status: str = "ok") -> None:
        """Close the session; a SessionError if any record was lost (full disk, removed log)."""
        self._check(self.lib.llama_instr_session_end(status.encode()), "llama_instr_session_end")

    def set_level(self, level: str) -> int:
        return self._check(self.lib.llama_instr_set_level(LEVEL_IDS[level]), "set_level")

    def get_level(self) -> int:
        return int(self.lib.llama_instr_get_level())

    def set_topk(self, k: int) -> None:
        self._check(self.lib.llama_instr_set_topk(k), "set_topk")

    def flush(self) -> None:
        self._check(self.lib.llama_instr_flush(), "flush")

    def record_transfers(self, on: bool = True) -> bool:
        """Keep the commands sent to RPC servers until the next session begins, which writes them
        first (the model's upload, when called before loading it). False when the build has no RPC
        backend (nothing to record)."""
        return bool(self.lib.llama_instr_record_transfers(1 if on else 0) == 0)

    def set_memory_budget(self, spec: str | None) -> None:
        """Make devices behave as if they had only this much memory ("DEVICE=SIZE[,...]", see
        ``llamacpp_instr.running.memory_budget``); None or "" removes the budget. A UserError if malformed or
        naming a device that does not exist."""
        rc = self.lib.llama_instr_set_memory_budget((spec or "").encode())
        if rc != 0:
            raise UserError(self.last_error() or f"bad memory budget {spec!r}")

    def memory_breakdown(self, ctx: Any) -> list[dict[str, Any]]:
        """What llama.cpp says ``ctx`` and its model take, per buffer type (its own
        llama_get_memory_breakdown): with a model and context made with no_alloc, its projection
        without allocating."""
        n = self._check(self.lib.llama_instr_memory_breakdown(ctx, None, 0), "memory_breakdown")
        buf = ctypes.create_string_buffer(n + 1)
        self.lib.llama_instr_memory_breakdown(ctx, buf, n + 1)
        rows = json.loads(buf.value.decode(errors="replace"))
        return rows if isinstance(rows, list) else []

    def graph_reserve(self, ctx: Any, n_tokens: int, n_outputs: int) -> dict[str, Any]:
        """The node table of the graph ``ctx`` builds for a ubatch of ``n_tokens`` tokens with
        ``n_outputs`` outputs, its KV cache at full size, as a ``graph`` record with a device per
        node (``devices``): built and split by llama.cpp and ggml, never computed, so a model and
        context made with no_alloc give it."""
        fn = self.lib.llama_instr_graph_reserve
        n = self._check(fn(ctx, n_tokens, n_outputs, None, 0), "graph_reserve")
        buf = ctypes.create_string_buffer(n + 1)
        self._check(fn(ctx, n_tokens, n_outputs, buf, n + 1), "graph_reserve")
        value = json.loads(buf.value.decode(errors="replace"))
        if not isinstance(value, dict):
            raise UserError("llama_instr_graph_reserve gave no graph record")
        return value

    def memory_failure(self) -> dict[str, Any] | None:
        """The last backend buffer allocation that failed in this process (the fields of a
        memory_alloc_failed record), or None."""
        n = int(self.lib.llama_instr_memory_failure(None, 0))
        if n <= 0:
            return None
        buf = ctypes.create_string_buffer(n + 1)
        self.lib.llama_instr_memory_failure(buf, n + 1)
        value = json.loads(buf.value.decode(errors="replace"))
        return value if isinstance(value, dict) else None

    def session_path(self) -> str:
        n = self._check(self.lib.llama_instr_session_path(None, 0), "session_path")
        buf = ctypes.create_string_buffer(n + 1)
        self.lib.llama_instr_session_path(buf, n + 1)
        return buf.value.decode(errors="replace")

    def totals(self) -> Totals:
        t = Totals()
        self._check(self.lib.llama_instr_session_totals(ctypes.byref(t)), "session_totals")
        return t

    def set_request(self, ctx: Any, request_id: str | None) -> None:
        """Tag the steps ``ctx`` decodes from now on with ``request_id`` (None clears it)."""
        rc = self.lib.llama_instr_set_request(ctx, (request_id or "").encode())
        self._check(rc, "set_request")

    def set_sampling(self, every_steps: int = 1, every_requests: int = 1) -> None:
        """For the next session: one step in ``every_steps``, the steps of one request in
        ``every_requests``, at the session's level; the others at minimal."""
        self._check(self.lib.llama_instr_set_sampling(every_steps, every_requests), "set_sampling")

    def set_rotation(self, max_bytes: int = 0, keep: int = 0) -> None:
        """For the next session: rotate the log at ``max_bytes`` (0: never), keeping ``keep``
        older files (LOG.1 .. LOG.keep)."""
        self._check(self.lib.llama_instr_set_rotation(max_bytes, keep), "set_rotation")

    def reopen(self) -> None:
        """Reopen the log at its path at the next step boundary (after logrotate moved it)."""
        self.lib.llama_instr_reopen()

    def request_begin(self, ctx: Any, seq_id: int = -1) -> str:
        """A request begins on ``seq_id`` of ``ctx`` (-1: the whole context), for request
        sampling; the level its steps are recorded at."""
        return LEVELS[self._check(self.lib.llama_instr_request_begin(ctx, seq_id), "request_begin")]

    def request_end(self, ctx: Any, seq_id: int = -1) -> None:
        self._check(self.lib.llama_instr_request_end(ctx, seq_id), "request_end")

    def write_record(self, type_: str, fields: dict[str, Any]) -> None:
        """Append a record of our own (e.g. a served request) to the open session's log."""
        body = _json(fields, f"the fields of a {type_} record")
        self._check(self.lib.llama_instr_write_record(type_.encode(), body), "write_record")

    def capture(self, ctx: Any, patterns: list[str]) -> None:
        """Copy the outputs of the nodes matching ``patterns`` ("l_out-*", "result_output") from
        the next llama_decode of ``ctx`` on; an empty list stops."""
        arr = (ctypes.c_char_p * max(1, len(patterns)))(*[p.encode() for p in patterns])
        self._check(self.lib.llama_instr_capture(ctx, arr, len(patterns)), "capture")

    def captured(self, ctx: Any) -> dict[str, Any]:
        """The outputs captured by the last llama_decode of ``ctx`` (its last ubatch): node name ->
        float32 array shaped (ne3, ne2, ne1, ne0) without leading 1s."""
        import numpy as np

        out: dict[str, Any] = {}
        name = ctypes.create_string_buffer(128)
        ne = (ctypes.c_int64 * 4)()
        for i in range(int(self.lib.llama_instr_captured_count(ctx))):
            n = self.lib.llama_instr_captured_get(ctx, i, name, 128, ne, None, 0)
            self._check(int(n), "captured_get")
            buf = np.empty(int(n), dtype=np.float32)
            self.lib.llama_instr_captured_get(
                ctx, i, name, 128, ne, buf.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), n
            )
            shape = [int(ne[3]), int(ne[2]), int(ne[1]), int(ne[0])]
            while len(shape) > 1 and shape[0] == 1:
                shape.pop(0)
            out[name.value.decode()] = buf.reshape(shape)
        return out


def _declare(lib: ctypes.CDLL) -> None:
    c = ctypes
    sigs: dict[str, tuple[list[Any], Any]] = {
        "llama_instr_api_version": ([], c.c_int32),
        "llama_instr_build_info": ([], c.c_char_p),
        "llama_instr_session_begin": ([c.c_void_p, c.c_char_p, c.c_int32, c.c_char_p], c.c_int32),
        "llama_instr_session_end": ([c.c_char_p], c.c_int32),
        "llama_instr_set_level": ([c.c_int32], c.c_int32),
        "llama_instr_get_level": ([], c.c_int32),
        "llama_instr_set_topk": ([c.c_int32], c.c_int32),
        "llama_instr_flush": ([], c.c_int32),
        "llama_instr_record_transfers": ([c.c_int32], c.c_int32),
        "llama_instr_session_path": ([c.c_char_p, c.c_size_t], c.c_int32),
        "llama_instr_set_memory_budget": ([c.c_char_p], c.c_int32),
        "llama_instr_memory_failure": ([c.c_char_p, c.c_size_t], c.c_int32),
        "llama_instr_memory_breakdown": ([c.c_void_p, c.c_char_p, c.c_size_t], c.c_int32),
        "llama_instr_graph_reserve": (
            [c.c_void_p, c.c_int32, c.c_int32, c.c_char_p, c.c_size_t],
            c.c_int32,
        ),
        "llama_instr_session_totals": ([c.POINTER(Totals)], c.c_int32),
        "llama_instr_last_error": ([], c.c_char_p),
        "llama_instr_set_request": ([c.c_void_p, c.c_char_p], c.c_int32),
        "llama_instr_write_record": ([c.c_char_p, c.c_char_p], c.c_int32),
        "llama_instr_capture": ([c.c_void_p, c.POINTER(c.c_char_p), c.c_int32], c.c_int32),
        "llama_instr_captured_count": ([c.c_void_p], c.c_int32),
        "llama_instr_captured_get": (
            [c.c_void_p, c.c_int32, c.c_char_p, c.c_size_t, c.POINTER(c.c_int64)]
            + [c.POINTER(c.c_float), c.c_int64],
            c.c_int64,
        ),
        "llama_instr_set_sampling": ([c.c_int32, c.c_int32], c.c_int32),
        "llama_instr_set_rotation": ([c.c_int64, c.c_int32], c.c_int32),
        "llama_instr_reopen": ([], None),
        "llama_instr_request_begin": ([c.c_void_p, c.c_int32], c.c_int32),
        "llama_instr_request_end": ([c.c_void_p, c.c_int32], c.c_int32),
        "llama_instr_machine_info": ([], c.c_char_p),
        "llama_instr_probe_run": ([c.POINTER(Probe)], c.c_int32),
    }
    for name, (argtypes, restype) in sigs.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            # the library speaks our API version but predates this function: an older build of
            # the same patches' API, e.g. from before a rebuild
            raise UserError(
                f"the installed patched llama-cpp-python lacks {name} (built from older patches); "
                f"{_STOCK_HINT}"
            ) from None
        fn.argtypes = argtypes
        fn.restype = restype


_cached: InstrLib | None = None


def load() -> InstrLib:
    """The instrumentation API; a UserError if the installed llama_cpp is the stock build."""
    global _cached
    if _cached is not None:
        return _cached
    llama_cpp = import_llama_cpp()
    lib = llama_cpp.llama_cpp._lib
    if not hasattr(lib, "llama_instr_api_version"):
        version = getattr(llama_cpp, "__version__", "?")
        raise UserError(
            f"the installed llama-cpp-python {version} is the stock build without instrumentation "
            f"hooks; {_STOCK_HINT}"
        )
    lib.llama_instr_api_version.restype = ctypes.c_int32
    api = lib.llama_instr_api_version()
    if api != pin.INSTR_API_VERSION:
        raise UserError(
            f"the installed patched llama-cpp-python speaks instrumentation API {api}, this "
            f"llamacpp-instr expects {pin.INSTR_API_VERSION}; {_STOCK_HINT}"
        )
    _declare(lib)
    _cached = InstrLib(lib)
    return _cached
