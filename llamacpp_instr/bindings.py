"""ctypes bindings to the ``llama_instr_*`` C API, from the very library handle llama_cpp loaded."""

from __future__ import annotations

import ctypes
import json
from dataclasses import dataclass
from typing import Any

from converters.errors import UserError
from llamacpp_instr import pin

LEVELS = {"off": 0, "minimal": 1, "detailed": 2, "verbose": 3}

_STOCK_HINT = "run `instr build` to build and install the patched llama-cpp-python"


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


@dataclass
class InstrLib:
    """The instrumentation functions of the loaded libllama."""

    lib: ctypes.CDLL

    def build_info(self) -> dict[str, Any]:
        return json.loads(self.lib.llama_instr_build_info().decode())

    def last_error(self) -> str:
        return self.lib.llama_instr_last_error().decode(errors="replace")

    def session_begin(self, ctx: Any, path: str, level: str, metadata: dict[str, Any]) -> None:
        rc = self.lib.llama_instr_session_begin(
            ctx, path.encode(), LEVELS[level], json.dumps(metadata).encode()
        )
        if rc != 0:
            raise UserError(self.last_error() or f"llama_instr_session_begin failed ({rc})")

    def session_end(self, status: str = "ok") -> None:
        rc = self.lib.llama_instr_session_end(status.encode())
        if rc != 0:
            raise UserError(self.last_error() or f"llama_instr_session_end failed ({rc})")

    def set_level(self, level: str) -> int:
        return int(self.lib.llama_instr_set_level(LEVELS[level]))

    def get_level(self) -> int:
        return int(self.lib.llama_instr_get_level())

    def set_topk(self, k: int) -> None:
        if self.lib.llama_instr_set_topk(k) != 0:
            raise UserError(self.last_error())

    def flush(self) -> None:
        self.lib.llama_instr_flush()

    def session_path(self) -> str:
        return self.lib.llama_instr_session_path().decode()

    def totals(self) -> tuple[int, int, int]:
        steps, tokens, records = ctypes.c_int64(), ctypes.c_int64(), ctypes.c_int64()
        self.lib.llama_instr_session_totals(
            ctypes.byref(steps), ctypes.byref(tokens), ctypes.byref(records)
        )
        return steps.value, tokens.value, records.value

    @property
    def cb_eval_peer(self) -> int:
        """Address of the native upstream-style cb_eval (for the overhead benchmark's peer)."""
        return ctypes.cast(self.lib.llama_instr_cb_eval_peer, ctypes.c_void_p).value or 0

    def cb_eval_peer_count(self) -> int:
        return int(self.lib.llama_instr_cb_eval_peer_count())


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
        "llama_instr_session_path": ([], c.c_char_p),
        "llama_instr_last_error": ([], c.c_char_p),
        "llama_instr_session_totals": (
            [c.POINTER(c.c_int64), c.POINTER(c.c_int64), c.POINTER(c.c_int64)],
            c.c_int32,
        ),
        "llama_instr_cb_eval_peer_count": ([], c.c_int64),
    }
    for name, (argtypes, restype) in sigs.items():
        fn = getattr(lib, name)
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
    _declare(lib)
    api = lib.llama_instr_api_version()
    if api != pin.INSTR_API_VERSION:
        raise UserError(
            f"the installed patched llama-cpp-python speaks instrumentation API {api}, this "
            f"llamacpp-instr expects {pin.INSTR_API_VERSION}; {_STOCK_HINT}"
        )
    _cached = InstrLib(lib)
    return _cached
