"""Where given weight tensors live: llama.cpp's ``-ot/--override-tensor``, ``--n-cpu-moe`` and
``--cpu-moe``, for the models the runner and the server load.

A rule is a regular expression searched in each weight tensor's GGUF name and the buffer type its
matches go to (``CPU``, ``Vulkan0``...: ggml's name of a device's buffer type), as
``llama_model_params.tensor_buft_overrides`` takes them (a NULL-terminated array of ``{pattern,
buft}``; the first rule that matches a tensor wins). ``--n-cpu-moe N`` is llama.cpp's one rule per
layer ``blk\\.I\\.ffn_(up|down|gate|gate_up)_(ch|)exps`` for I < N to the CPU, ``--cpu-moe`` the
same without the layer (common/common.h, ``llm_add_n_cpu_ffn_overrides``).

``TensorOverrides`` holds the rules and checks their syntax without touching llama.cpp;
``TensorOverrides.loading`` finds the buffer types by name in ggml's device registry and sets the
params of every model loaded inside it (the pattern strings live until the block ends).
"""

from __future__ import annotations

import ctypes
import re
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from llamacpp_instr.contract.errors import UserError

# common/common.h LLM_FFN_EXPS_REGEX: a MoE layer's expert tensors
EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
CPU = "CPU"  # ggml_backend_buft_name(ggml_backend_cpu_buffer_type())
# a group Python takes and std::regex's ECMAScript grammar does not (it has (?: (?= (?! only)
_NOT_ECMASCRIPT = re.compile(r"(?<!\\)\(\?(?![:=!])")


def n_cpu_moe_patterns(n: int) -> list[str]:
    """llama.cpp's --n-cpu-moe N: one pattern per layer 0..N-1."""
    return [rf"blk\.{i}{EXPS_REGEX}" for i in range(n)]


def parse_override(value: str) -> tuple[tuple[str, str], ...]:
    """One -ot value, ``PATTERN=BUFFER_TYPE[,PATTERN=BUFFER_TYPE...]``, as (pattern, buffer type)
    pairs; a UserError for a missing ``=``, an empty side or a pattern that is not a regular
    expression."""
    rules = []
    for part in value.split(","):
        pattern, eq, buft = part.partition("=")
        if not eq or not pattern or not buft:
            raise UserError(f"-ot/--override-tensor takes PATTERN=BUFFER_TYPE[,...], not {value!r}")
        try:
            with warnings.catch_warnings():  # [[:alpha:]] is ECMAScript's, a warning to Python
                warnings.simplefilter("ignore")
                re.compile(pattern)
        except re.error as exc:
            raise UserError(
                f"-ot/--override-tensor: {pattern!r} is not a regular expression ({exc})"
            ) from None
        if _NOT_ECMASCRIPT.search(pattern):
            raise UserError(
                f"-ot/--override-tensor: {pattern!r}: llama.cpp's regular expressions (C++ "
                "std::regex, ECMAScript) have no (?flags), (?P...) nor lookbehind"
            )
        rules.append((pattern, buft))
    return tuple(rules)


@dataclass(frozen=True)
class TensorOverrides:
    """The rules, in the order llama.cpp tries them: every -ot rule as given, then --cpu-moe's,
    then --n-cpu-moe's (the first that matches a tensor wins)."""

    rules: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_options(
        cls,
        override_tensor: Iterable[str] = (),
        n_cpu_moe: int | None = None,
        cpu_moe: bool = False,
    ) -> TensorOverrides:
        rules: list[tuple[str, str]] = []
        for value in override_tensor:
            rules += parse_override(value)
        if cpu_moe:
            rules.append((EXPS_REGEX, CPU))
        if n_cpu_moe is not None:
            if n_cpu_moe < 0:
                raise UserError(f"-ncmoe/--n-cpu-moe must be >= 0, got {n_cpu_moe}")
            rules += [(p, CPU) for p in n_cpu_moe_patterns(n_cpu_moe)]
        return cls(tuple(rules))

    def __bool__(self) -> bool:
        return bool(self.rules)

    def describe(self) -> list[list[str]]:
        """The rules as a session's metadata records them: ``[pattern, buffer type]`` each."""
        return [list(r) for r in self.rules]

    def command_line(self) -> list[str]:
        """The rules as one -ot option of llama.cpp's programs (and instr's)."""
        if not self.rules:
            return []
        return ["-ot", ",".join(f"{p}={b}" for p, b in self.rules)]

    @contextmanager
    def loading(self) -> Iterator[None]:
        """Inside the block, every model llama-cpp-python loads gets these rules (nothing changes
        without rules). Nest it inside ``Placement.loading`` (which serializes loads); a buffer
        type no device has is a UserError naming those there are, before anything loads."""
        if not self.rules:
            yield
            return
        from llama_cpp import llama_cpp

        bufts = buffer_types()
        for _, name in self.rules:
            if name not in bufts:
                raise UserError(
                    f"-ot/--override-tensor: unknown buffer type {name!r}; this build has "
                    f"{', '.join(bufts) or 'none'}"
                )
        patterns = [p.encode() for p, _ in self.rules]  # alive until the block ends
        array = (_Override * (len(self.rules) + 1))(
            *[_Override(p, bufts[b]) for p, (_, b) in zip(patterns, self.rules, strict=True)],
            _Override(None, None),
        )
        original = llama_cpp.llama_model_load_from_file

        def overridden(path: bytes, params: Any) -> Any:
            params.tensor_buft_overrides = ctypes.addressof(array)
            return original(path, params)

        llama_cpp.llama_model_load_from_file = overridden
        try:
            yield
        finally:
            llama_cpp.llama_model_load_from_file = original


class _Override(ctypes.Structure):
    """struct llama_model_tensor_buft_override (llama.h)."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def buffer_types() -> dict[str, int]:
    """Every device's buffer type by name (ggml_backend_buft_name of ggml_backend_dev_buffer_type),
    as llama.cpp's -ot finds them: ``CPU``, ``Vulkan0``, ``RPC0[host:port]``..."""
    from llamacpp_instr.running import devices

    lib = devices._lib()
    c = ctypes
    lib.ggml_backend_dev_buffer_type.argtypes = [c.c_void_p]
    lib.ggml_backend_dev_buffer_type.restype = c.c_void_p
    lib.ggml_backend_buft_name.argtypes = [c.c_void_p]
    lib.ggml_backend_buft_name.restype = c.c_char_p
    out: dict[str, int] = {}
    for d in devices.registry():
        buft = lib.ggml_backend_dev_buffer_type(d.ptr)
        if buft:
            out.setdefault(lib.ggml_backend_buft_name(buft).decode(errors="replace"), int(buft))
    return out
