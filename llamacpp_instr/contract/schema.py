"""The session log's contract in one place: schema versions, record types and levels.

The native side writes ``schema_version`` and ``level`` into ``session_start``; everything in
Python that names a level or a version takes it from here.
"""

from __future__ import annotations

# Versions the reader understands (the newest is what the patched build writes). 2: a graph
# record may name an earlier graph's node table (same_as) instead of holding nodes. 3: and name
# it with the numbers of its shapes and bytes substituted (same_as with subst), which a version-2
# reader would take for the table itself. 4: images and sounds: `media` records, and steps of kind
# "encode" (an encoder's graph, in a context of role "encoder"), which a version-3 reader would take
# for prompt steps.
SCHEMA_VERSIONS = (1, 2, 3, 4)
CURRENT_SCHEMA_VERSION = SCHEMA_VERSIONS[-1]

RECORD_TYPES_V1 = frozenset(
    {
        "session_start",
        "step_begin",
        "step_end",
        "graph",
        "compute",
        "tensor_stats",
        "topk",
        "request",
        "part",
        "transfers",
        "memory_alloc",
        "memory_free",
        "memory_alloc_failed",
        "session_end",
        "experts",
        "context",
        "spec",
        "host",
        "chain",
        "perf",
        "media",
    }
)

# What a backend buffer is for (memory_alloc's "purpose"), in the native side's order.
MEMORY_PURPOSES = (
    "other",
    "weights",
    "kv_cache",
    "compute",
    "output",
    "recurrent",
    "host_pinned",
    "encoder_weights",
    "encoder_compute",
)

# Recording levels, by their number in the C API (enum llama_instr_level).
LEVELS = ("off", "minimal", "detailed", "verbose")
LEVEL_IDS = {name: i for i, name in enumerate(LEVELS)}
# The levels a session can be opened at.
SESSION_LEVELS = LEVELS[1:]


def level_at_least(level: str, minimum: str) -> bool:
    """Does a log recorded at ``level`` hold what ``minimum`` records?"""
    return LEVEL_IDS.get(level, 0) >= LEVEL_IDS[minimum]
