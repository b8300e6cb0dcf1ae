"""Two processes asking for the same tools build: one builds, the other waits for it and then uses
what it built (before the lock, both ran CMake into one tree and one failed on the other's files).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from llamacpp_instr.native import tools


def test_a_second_build_of_a_key_waits_for_the_first_and_reuses_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLAMACPP_INSTR_CACHE", str(tmp_path))
    running = 0
    most = 0
    builds = 0
    guard = threading.Lock()

    def fake_build(plan, missing, echo, jobs):  # type: ignore[no-untyped-def]
        nonlocal running, most, builds
        with guard:
            running += 1
            builds += 1
            most = max(most, running)
        time.sleep(0.3)  # long enough for the other thread to reach the lock
        out = tools.bin_dir(plan)
        out.mkdir(parents=True, exist_ok=True)
        for p in missing:
            (out / p).write_text("built")
        with guard:
            running -= 1
        return out

    monkeypatch.setattr(tools, "_build", fake_build)
    said: list[str] = []
    threads = [
        threading.Thread(
            target=tools.build_tools, args=(said.append,), kwargs={"programs": ["llama-bench"]}
        )
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most == 1 and builds == 1
    assert any(s.startswith("using cached tools in ") for s in said)
