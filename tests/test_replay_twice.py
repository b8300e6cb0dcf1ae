"""The same recording replayed twice under the same setting, against the real llama-server: on a
quiet machine each request's time to first token agrees between the replays (the median of the
requests' ratios within 10 %),
and each replay gives back the recording's tokens, request by request. A replay that a user reruns
to confirm a verdict must see the figures it saw the first time, or no comparison of settings
means anything."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from test_replay_server import _replay, record

pytestmark = pytest.mark.native

WORDS = "a farmer walks along the river to the market with apples and pears".split()
# twelve requests on two slots, 150 ms apart: prompts of 20 to 75 words, half of them streamed,
# some of each overlapping another's generation
TRAFFIC = [
    (
        "/completion",
        {
            "prompt": " ".join(WORDS[j % len(WORDS)] for j in range(20 + 5 * i)),
            "n_predict": 8,
            "temperature": 0,
            "seed": i,
            "stream": i % 2 == 0,
        },
        0.15 * i,
    )
    for i in range(12)
]


@pytest.fixture(scope="module")
def recorded(tools_bin: Path, smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return record(tmp_path_factory.mktemp("twice") / "recorded.log", smollm2_path, TRAFFIC)


def test_the_same_log_replayed_twice_gives_the_same_first_token_times(
    recorded: Path, tmp_path: Path
) -> None:
    ttfts = []
    for k in range(2):
        p = _replay(recorded, tmp_path / f"replay-{k}.log")
        stdout, stderr = p.communicate(timeout=600)
        assert p.returncode == 0, stderr
        rows = [r for r in json.loads(stdout)["requests"] if r["setting"] == "replay"]
        assert len(rows) == len(TRAFFIC) and all(r["ok"] and r["identical"] for r in rows), rows
        ttfts.append([r["ttft_ms"] for r in rows])
    # request by request: a median over all requests alone would hide two requests trading
    # places (a short prompt slower, a long one faster)
    ratios = [round(b / a, 3) for a, b in zip(*ttfts, strict=True)]
    medians = [round(statistics.median(t), 1) for t in ttfts]
    print(f"TTFT ratios, the second replay's to the first's: {ratios}; medians {medians} ms")
    assert abs(statistics.median(ratios) - 1) <= 0.10, (ratios, medians)
