"""The media of a recorded body: each ``instr_media`` marker (the hash, size and head of a string
that held an image or a sound), found again in a folder by hashing its files, and put back as the
string the client sent (``prefix`` + base64 of the bytes).

A marker is matched by its hash and its size together, and only files of a size some marker names
are read and hashed; a request whose media are not all found is not sent (never with another
medium)."""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.contract.media_hash import media_hash

MARKER = "instr_media"
_HASH = re.compile(r"^[0-9a-f]{16}$")
# what a folder of media may hold, at most: files walked, and the bytes of a medium read
FILES_MAX = 100_000
MEDIUM_MAX = 256 << 20


@dataclass(frozen=True)
class Medium:
    """A marker's fields: the hash of the decoded bytes, their length, and the string's head."""

    hash: str
    bytes: int
    prefix: str


def as_marker(v: Any) -> Medium | None:
    """The medium a value of a body stands for, when it is a well-formed marker."""
    if type(v) is not dict or len(v) != 1 or type(v.get(MARKER)) is not dict:
        return None
    m = v[MARKER]
    h, n, prefix = m.get("hash"), m.get("bytes"), m.get("prefix", "")
    if type(h) is not str or not _HASH.match(h) or type(n) is not int or type(prefix) is not str:
        return None
    if not 0 <= n <= MEDIUM_MAX or len(prefix) > 256:
        return None
    return Medium(h, n, prefix)


def markers(body: Any) -> Iterator[Medium]:
    """Every marker of a body, depth first (a body is as deep as its JSON decoder let it be)."""
    stack = [body]
    while stack:
        v = stack.pop()
        m = as_marker(v)
        if m is not None:
            yield m
        elif type(v) is dict:
            stack.extend(v.values())
        elif type(v) is list:
            stack.extend(v)


def inflate(body: Any, found: dict[Medium, Path]) -> Any:
    """The body with each marker replaced by the string it stood for (its file's bytes, base64,
    after the prefix); every marker must be in ``found``."""
    m = as_marker(body)
    if m is not None:
        return m.prefix + base64.b64encode(found[m].read_bytes()).decode("ascii")
    if type(body) is dict:
        return {k: inflate(v, found) for k, v in body.items()}
    if type(body) is list:
        return [inflate(v, found) for v in body]
    return body


class MediaFolder:
    """The files of a folder (and its subfolders) that are the media some markers name: only a
    file of a size a marker names is read, once, and kept by its hash (its path, not its bytes)."""

    def __init__(self, folder: Path | None) -> None:
        if folder is not None and not folder.is_dir():
            raise UserError(f"--media {folder}: not a folder")
        self.folder = folder
        self.by_size: dict[int, list[Path]] | None = None
        self.by_hash: dict[tuple[str, int], Path] = {}
        self.hashed: set[Path] = set()

    def _sizes(self) -> dict[int, list[Path]]:
        if self.by_size is None:
            self.by_size = {}
            walked = 0
            for root, _, files in os.walk(self.folder) if self.folder else ():
                for name in files:
                    walked += 1
                    if walked > FILES_MAX:
                        raise UserError(f"--media {self.folder}: over {FILES_MAX:,} files")
                    p = Path(root) / name
                    try:
                        size = p.stat().st_size
                    except OSError:
                        continue
                    if p.is_file() and size <= MEDIUM_MAX:
                        self.by_size.setdefault(size, []).append(p)
        return self.by_size

    def find(self, m: Medium) -> Path | None:
        """The file holding the marker's bytes, or None."""
        for p in self._sizes().get(m.bytes, []):
            if p not in self.hashed:
                self.hashed.add(p)
                try:
                    self.by_hash.setdefault((media_hash(p.read_bytes()), m.bytes), p)
                except OSError:
                    continue
            if (m.hash, m.bytes) in self.by_hash:
                break
        return self.by_hash.get((m.hash, m.bytes))

    def resolve(self, body: Any) -> dict[Medium, Path] | None:
        """Each marker of ``body`` and its file; None when one is not at hand."""
        found: dict[Medium, Path] = {}
        for m in markers(body):
            p = self.find(m)
            if p is None:
                return None
            found[m] = p
        return found
