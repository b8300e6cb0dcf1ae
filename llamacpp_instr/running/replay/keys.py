"""The API key a replay's requests carry (``Authorization: Bearer KEY``) to a server that wants
one: llama-server's own ``--api-key KEY`` (a comma-separated list), else its ``--api-key-file``
(one key a line, ``#`` a comment), else the ``LLAMA_API_KEY`` its environment holds, as
llama-server reads them; for ``--url``, the key given.

The key is a secret: a server a replay starts gets ``--api-key``'s keys in its environment
(``LLAMA_API_KEY``, which llama-server reads for an option its command line does not give), never
on its command line, which the session log records and ``ps`` shows; a key is never written to the
log, the report or the responses file, and a setting that names one is shown with ``***``."""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from llamacpp_instr.contract.errors import UserError

OPTION, FILE_OPTION, ENV = "--api-key", "--api-key-file", "LLAMA_API_KEY"
FILE_ENV = "LLAMA_ARG_API_KEY_FILE"
HIDDEN = "***"
# a key file read, at most (bytes): a key is a line
FILE_MAX = 1 << 20


@dataclass(frozen=True)
class Keyed:
    """A server's arguments without ``--api-key`` and its values; ``keys``: those values (each a
    comma-separated list), for its environment; ``key``: the one a client sends (None: none)."""

    args: tuple[str, ...]
    keys: tuple[str, ...]
    key: str | None

    def env(self) -> dict[str, str]:
        """What the server's environment gets: the keys its command line no longer names."""
        return {ENV: ",".join(self.keys)} if self.keys else {}


def _values(args: Sequence[str], name: str) -> tuple[list[str], list[str]]:
    """``args`` without ``name`` (``name V`` or ``name=V``), and each value it had."""
    rest: list[str] = []
    values: list[str] = []
    k = 0
    while k < len(args):
        a = args[k]
        if a == name:
            if k + 1 >= len(args):
                raise UserError(f"llama-server {name}: give its value")
            values.append(args[k + 1])
            k += 2
            continue
        if a.startswith(name + "="):
            values.append(a[len(name) + 1 :])
        else:
            rest.append(a)
        k += 1
    return rest, values


def _first_in_list(text: str) -> str | None:
    return next((k.strip() for k in text.split(",") if k.strip()), None)


def _first_in_file(path: str) -> str | None:
    """The first key of a key file (a line not empty and not a ``#`` comment), as llama-server
    reads it."""
    try:
        with open(Path(path), "rb") as f:
            text = f.read(FILE_MAX).decode("utf-8", "replace")
    except OSError as exc:
        raise UserError(f"llama-server {FILE_OPTION} {path}: {exc.strerror or exc}") from None
    return next((line for line in text.splitlines() if line and line[0] != "#"), None)


def keyed(args: Sequence[str], environ: Mapping[str, str] | None = None) -> Keyed:
    """The key of a server started with ``args`` in ``environ`` (default: this process's): its
    ``--api-key``'s first, else its ``--api-key-file``'s (``LLAMA_ARG_API_KEY_FILE``), else
    ``LLAMA_API_KEY``'s; and its arguments without ``--api-key``."""
    env = os.environ if environ is None else environ
    rest, given = _values(args, OPTION)
    _, files = _values(rest, FILE_OPTION)
    key = next((k for v in given if (k := _first_in_list(v)) is not None), None)
    if key is None and (files or env.get(FILE_ENV)):
        key = _first_in_file(files[0] if files else env[FILE_ENV])
    if key is None and not given and env.get(ENV):
        key = _first_in_list(env[ENV])
    return Keyed(tuple(rest), tuple(given), key)


def hidden(setting: str) -> str:
    """A ``--set`` as shown: an ``--api-key``'s value as ``***``."""
    if OPTION not in setting:
        return setting
    try:
        words = shlex.split(setting)
    except ValueError:
        return HIDDEN  # (a setting that does not split is refused before it is shown)
    out = []
    for k, w in enumerate(words):
        if k > 0 and words[k - 1] == OPTION:
            out.append(HIDDEN)
        elif w.startswith(OPTION + "="):
            out.append(f"{OPTION}={HIDDEN}")
        else:
            out.append(shlex.quote(w))
    return " ".join(out)
