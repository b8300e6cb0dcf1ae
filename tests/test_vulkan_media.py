"""An image's encode on a Vulkan device (Mesa's lavapipe): mtmd runs its encoder on the GPU
backend it finds, and every op of the encoder's graph is timed by that device (its own
timestamps), as a decode's ops are: `instr run --mmproj --image` on the Vulkan build."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.support import by_type, read_log
from helpers.vulkan_backend import vulkan_device, vulkan_env

pytestmark = pytest.mark.vulkan


def test_an_images_encode_is_timed_op_by_op_on_the_vulkan_device(
    smollm2_path: Path, projectors: dict[str, Path], media: dict[str, Path], tmp_path: Path
) -> None:
    """Two images through a gemma3 projector on lavapipe: each encode's compute runs its ops on
    the Vulkan device (a split of it), each op timed there (the device's busy stretches and clock
    pair beside), every op of the graph's blocks and projector in a layer span of that device;
    the first encode (the device's pipelines made on first use) is marked first."""
    name = vulkan_device()
    env = vulkan_env()
    env.setdefault("MTMD_CPP_LIB", env["LLAMA_CPP_LIB_PATH"])
    log = tmp_path / "vk.log"
    image = str(media["test-1.jpeg"])
    r = subprocess.run(
        [sys.executable, "-m", "llamacpp_instr.cli", "run", str(smollm2_path)]
        + ["--mmproj", str(projectors["gemma3"]), "--image", image, "--image", image]
        + ["-p", "Describe the images.", "-n", "2", "-o", str(log)],
        capture_output=True,
        text=True,
        env=dict(os.environ, **env),
        timeout=1800,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    recs = read_log(log)
    start = recs[0]
    devices = start["machine"]["devices"]
    (vk,) = [d["index"] for d in devices if d["name"] == name]
    [enc] = [c for c in by_type(recs, "context") if c["role"] == "encoder"]
    begins = {(b["ctx"], b["step"]): b for b in by_type(recs, "step_begin")}
    encodes = [b for b in begins.values() if b["kind"] == "encode"]
    assert [b["first"] for b in encodes] == [True, False]
    comp = [c for c in by_type(recs, "compute") if c["ctx"] == enc["ctx"]]
    assert len(comp) == 2
    for c in comp:
        on_vk = [s for s in c["splits"] if s[0] == vk]
        assert on_vk, c["splits"]
        assert any(b[0] == vk for b in c["busy"]) and any(k[0] == vk for k in c["clocks"])
        spans = [layer for layer in c["layers"] if len(layer) == 5 and layer[4] == vk]
        # the encoder's two blocks and its projector, on the device
        assert sorted({layer[0] for layer in spans}) == [0, 1, 2], c["layers"]
        vk_nodes = {i for s in on_vk for i in range(s[1], s[2])}
        assert any(op[0] in vk_nodes for op in c["ops"])
