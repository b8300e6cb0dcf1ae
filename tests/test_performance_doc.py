"""docs/performance.md (what the instrumentation costs) and docs/accuracy.md (how true the
predictions and the figures that decide a run are) hold today's tables and how to rerun each, and
stay that short.

The tables are the bench scripts' own: ``--write-docs`` rewrites the text between a section's
``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``, so every marker must close, once, and name a
script that writes it: ``bench/NAME.py``, or the script its section's heading names, whose source
names the marker. What a page says around its tables (what each bench measures, its target, the
rerun command) is held to a number of lines that leaves room; the tables take what the scripts
write. The same holds for docs/quantization.md, which the quantization bench writes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "performance.md"
ACCURACY = ROOT / "docs" / "accuracy.md"
PAGES = (PAGE, ACCURACY, ROOT / "docs" / "quantization.md")
# each page's lines in all, and its own words around the tables
LIMITS = {PAGE: (500, 250), ACCURACY: (400, 150)}

_OPEN = re.compile(r"^<!-- bench:([\w-]+) -->$")
_CLOSE = re.compile(r"^<!-- /bench:([\w-]+) -->$")
_SCRIPT = re.compile(r"`(bench/[\w-]+\.(?:py|sh))")


def blocks(page: Path) -> list[tuple[str, int, int, str]]:
    """(name, first line, last line, the nearest heading above) of each bench block of ``page``;
    markers that do not pair (an open one unclosed, a close without its open, one inside another)
    fail here."""
    found = []
    opened: tuple[str, int, str] | None = None
    heading = ""
    for n, line in enumerate(page.read_text(encoding="utf-8").splitlines()):
        if line.startswith("#") and opened is None:
            heading = line
        if m := _OPEN.match(line.strip()):
            assert opened is None, f"{page.name}:{n + 1}: bench:{m[1]} opens inside {opened}"
            opened = (m[1], n, heading)
        elif m := _CLOSE.match(line.strip()):
            assert (
                opened and opened[0] == m[1]
            ), f"{page.name}:{n + 1}: /bench:{m[1]} closes {opened}"
            found.append((opened[0], opened[1], n, opened[2]))
            opened = None
        else:
            assert "bench:" not in line or "<!--" not in line, f"{page.name}:{n + 1}: {line!r}"
    assert opened is None, f"{page.name}: bench:{opened[0]} never closes"
    return found


@pytest.mark.parametrize("page", list(LIMITS), ids=lambda p: p.name)
def test_the_bench_pages_stay_short(page: Path) -> None:
    max_lines, max_prose = LIMITS[page]
    lines = page.read_text(encoding="utf-8").splitlines()
    inside = sum(last - first + 1 for _, first, last, _ in blocks(page))
    assert inside > 100  # the blocks were found
    assert len(lines) - inside <= max_prose, f"{len(lines) - inside} lines besides the tables"
    assert len(lines) <= max_lines


def test_each_bench_writes_the_page_that_holds_its_table() -> None:
    """bench/overhead.py's write_section finds a block on whichever page holds it; bench/predict.py
    writes its own blocks to accuracy.md."""
    import sys

    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from overhead import DOC_PAGES
    finally:
        sys.path.pop(0)
    assert {ROOT / "docs" / p for p in DOC_PAGES} == set(LIMITS)
    mine = {name for name, *_ in blocks(ACCURACY)}
    assert {"predict", "predict-threads", "predict-depth"} <= mine
    assert '"docs" / "accuracy.md"' in (ROOT / "bench" / "predict.py").read_text()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_bench_block_closes_and_names_the_script_that_writes_it(page: Path) -> None:
    found = blocks(page)
    names = [name for name, *_ in found]
    assert len(names) == len(set(names)), f"{page.name}: a block twice"
    text = page.read_text(encoding="utf-8").splitlines()
    for name, first, last, heading in found:
        own = ROOT / "bench" / f"{name}.py"
        script = own if own.is_file() else None
        if script is None:
            named = _SCRIPT.findall(heading)
            assert (
                named
            ), f"{page.name}: bench:{name} has no bench/{name}.py and its heading names none"
            script = ROOT / named[0]
        assert script.is_file(), f"{page.name}: bench:{name}: {script} does not exist"
        source = script.read_text(encoding="utf-8")
        assert re.search(
            rf"""["']{re.escape(name)}["']|bench:{re.escape(name)}\b""", source
        ), f"{script.name} never names the block {name}"
        body = "\n".join(text[first + 1 : last])
        for stamped in re.findall(r"_Measured [\d-]+ by `([^`\s]+)", body):
            assert (ROOT / stamped).is_file(), f"bench:{name} is stamped by {stamped}, not a file"
