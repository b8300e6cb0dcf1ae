"""Two processes asking for the same build (the tools, or a wheel's libraries): one builds, the
other waits for it and then uses what it built (before the lock, both ran CMake into one tree and
one failed on the other's files). A test that only reads a build (the Vulkan libraries, which
`.ci/run` builds beside the tests) waits for one in progress instead of skipping.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from llamacpp_instr.native import build, tools, wheel

pytestmark = pytest.mark.fast


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


def test_a_reader_waits_for_a_wheel_build_in_progress_and_gets_its_wheel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLAMACPP_INSTR_CACHE", str(tmp_path))
    plan = build.make_plan()
    said: list[str] = []
    assert build.wait_for_build(plan, said.append) is None  # neither built nor being built
    started = threading.Event()
    builds = 0

    def fake_build_wheel(plan_, echo):  # type: ignore[no-untyped-def]
        nonlocal builds
        builds += 1
        started.set()
        time.sleep(0.5)
        plan_.wheel_dir.mkdir(parents=True)
        wheel = plan_.wheel_dir / "llama_cpp_python-0.3.36-cp311-cp311-linux_x86_64.whl"
        wheel.write_text("built")
        return wheel

    monkeypatch.setattr(wheel, "build_wheel", fake_build_wheel)
    builder = threading.Thread(target=wheel.cached_or_built, args=(plan, said.append))
    builder.start()
    assert started.wait(10)
    got = build.wait_for_build(plan, said.append)
    builder.join()
    assert got is not None and got.read_text() == "built"
    assert any(s.startswith("waiting for the build of key ") for s in said)
    # a second build of the key finds the first's wheel
    assert wheel.cached_or_built(plan, said.append) == got and builds == 1
    # a lock left by a build that ended (here, or failed) holds no reader up
    (got.parent).rename(tmp_path / "gone")
    assert build.wait_for_build(plan, said.append) is None
