"""Debian's ``prometheus``, scraping one target every second: the real Prometheus of the metrics
test (tests/test_metrics.py) and of the exporter's cost under load (bench/serve_load.py)."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from helpers.support import free_port, wait_ready


class Prometheus:
    """Prometheus scraping ``127.0.0.1:target`` every second, its data in ``tmp``, until stop()."""

    def __init__(self, tmp: Path, target: int) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        cfg = tmp / "prometheus.yml"
        cfg.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            "  - job_name: instr\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{target}']}}]\n"
        )
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={tmp / 'tsdb'}"]
            + [f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_ready(self.port, self.proc, timeout=60, path="/-/ready")
        self.t0 = time.monotonic()

    def query(self, promql: str) -> list[dict[str, Any]]:
        q = urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.port}/api/v1/query?{q}", timeout=10
        ) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def value(self, promql: str) -> float | None:
        res = self.query(promql)
        return float(res[0]["value"][1]) if res else None

    def scrapes(self) -> int:
        """Its successful scrapes of the target since it started (``up`` is 1 for each)."""
        span = int(time.monotonic() - self.t0) + 5
        return int(self.value(f"sum_over_time(up[{span}s])") or 0)

    def wait_scraped(self, timeout: float = 60) -> None:
        """Until it has scraped the target once (its start-up, TSDB and first scrape are behind
        it); AssertionError after ``timeout`` s."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.value("up") == 1.0:
                return
            time.sleep(0.2)
        raise AssertionError("prometheus did not scrape its target")

    def cpu_s(self) -> float:
        """Its CPU time so far (user + system, s)."""
        return _cpu_s(self.proc.pid)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _cpu_s(pid: int) -> float:
    """A process's CPU time (user + system, s) from /proc, 0 once it is gone."""
    import os

    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
