"""Where given weight tensors live: llama.cpp's ``-ot/--override-tensor``, ``--n-cpu-moe`` and
``--cpu-moe``, for the models the runner and the server load.

A rule is a regular expression searched in each weight tensor's GGUF name and the buffer type its
matches go to (``CPU``, ``Vulkan0``...: ggml's name of a device's buffer type), as
``llama_model_params.tensor_buft_overrides`` takes them (a NULL-terminated array of ``{pattern,
buft}``; the first rule that matches a tensor wins). ``--n-cpu-moe N`` is llama.cpp's one rule per
layer ``blk\\.I\\.ffn_(up|down|gate|gate_up)_(ch|)exps`` for I < N to the CPU, ``--cpu-moe`` the
same without the layer (common/common.h, ``llm_add_n_cpu_ffn_overrides``).

``TensorOverrides`` holds the rules and checks their syntax without touching llama.cpp (data alone:
the planners read it); ``tensor_buffers.loading`` gives them to the models loaded in this process.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable
from dataclasses import dataclass

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
