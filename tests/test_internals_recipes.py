"""docs/internals.md's recipes hold for the tree as it is.

Each recipe ("Add a backend's op timer", "Add a record kind", "Add a report", "Add a command", "Add
a kind of compute") is a numbered list of the files a change touches. Every path an item names in backticks exists (a path
with a ``<placeholder>`` stands for a file to make, and matches at least one file already made that
way), and each place an item says a kind of thing is registered in holds every such thing of the
tree: every op timer in the seam's header, the makers' table and libllama's CMake list; every
record kind of the contract with its writer, its section of docs/schema.md and its branch of the
fold; every report format with its renderer, every chart kind with its drawing; every command with
its module, and every module of ``commands/`` a command's or one the recipe names as shared; every
kind of compute (a ``Pass`` of the decoder) with its fold event, its tables and its track.

The files a fact is read from are the ones the recipe names (found by their names' ends), so that
a file that moves fails here until its recipe follows it.
"""

from __future__ import annotations

import ast
import importlib
import re
import typing
from dataclasses import dataclass
from pathlib import Path

import pytest

from llamacpp_instr import cli
from llamacpp_instr.contract import schema
from llamacpp_instr.converters.reading.decode.passes import Pass
from llamacpp_instr.converters.reading.decode.sessions import Event
from llamacpp_instr.converters.reports import renderers
from llamacpp_instr.converters.session.fold import PASS_EVENTS
from llamacpp_instr.native import backends

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "internals.md"
RECIPES = (
    "Add a backend's op timer",
    "Add a record kind",
    "Add a report",
    "Add a command",
    "Add a kind of compute",
)
# a backticked token that is a path from the repository's root (a placeholder may stand in it): it
# holds a "/", or is one of the root's documents (`README.md`); a bare file name (`to_perfetto.py`)
# is an example, not a path
_PATH = re.compile(r"^(?:[\w.<>-]+/)+[\w.<>*-]*$|^[A-Z]+\.md$")
_PLACEHOLDER = re.compile(r"<[^>]+>")


@dataclass
class Item:
    text: str  # the item's whole text, its lines joined
    paths: list[str]  # the paths it names, in order


def recipe(title: str) -> list[Item]:
    """The numbered items of the section ``## title`` of docs/internals.md."""
    text = PAGE.read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"docs/internals.md has no section {title!r}"
    items: list[list[str]] = []
    for line in match.group(1).splitlines():
        if re.match(r"\d+\. ", line):
            items.append([line.split(". ", 1)[1]])
        elif items and line.startswith("   ") and line.strip():
            items[-1].append(line.strip())
    found = []
    for lines in items:
        joined = " ".join(lines)
        paths = [t for t in re.findall(r"`([^`\s]+)`", joined) if _PATH.match(t)]
        found.append(Item(joined, paths))
    return found


def named(items: list[Item], end: str) -> Path:
    """The file an item names whose path ends with ``end``."""
    for item in items:
        for p in item.paths:
            if p.endswith(end):
                return ROOT / p
    raise AssertionError(f"the recipe names no file ending with {end!r}")


def made_as(items: list[Item], end: str) -> list[Path]:
    """The files already made as the placeholder path ending with ``end`` names a new one."""
    for item in items:
        for p in item.paths:
            if p.endswith(end):
                return matches(p)
    raise AssertionError(f"the recipe names no file ending with {end!r}")


def matches(path: str) -> list[Path]:
    """The files (or folders) ``path`` names: itself, or with each placeholder as a wildcard."""
    if not _PLACEHOLDER.search(path):
        return [ROOT / path] if (ROOT / path).exists() else []
    return sorted(ROOT.glob(_PLACEHOLDER.sub("*", path)))


@pytest.mark.parametrize("title", RECIPES)
def test_every_file_a_recipe_names_exists(title: str) -> None:
    items = recipe(title)
    assert len(items) >= 5, f"{title}: {len(items)} items"  # the parse found the list
    for n, item in enumerate(items, 1):
        assert item.paths, f"{title}, item {n} names no file: {item.text[:80]}"
        for p in item.paths:
            assert matches(p), f"{title}, item {n}: {p} is not in the tree"


def test_every_op_timer_is_declared_tabled_and_built() -> None:
    items = recipe("Add a backend's op timer")
    timers = made_as(items, "llama-instr-ops-<backend>.cpp")
    assert len(timers) >= 4, timers  # CPU, RPC, Vulkan, CUDA
    header = named(items, "llama-instr-ops.h").read_text()
    table = named(items, "llama-instr-ops.cpp").read_text()
    cmake = " ".join(
        (ROOT / p).read_text() for item in items if "CMake list" in item.text for p in item.paths
    )
    rows = dict(
        (maker, reg)
        for reg, maker in re.findall(r'\{\s*"(\w+)",\s*(make_\w+_op_timer)\s*\}', table)
    )
    for timer in timers:
        makers = set(re.findall(r"\b(make_\w+_op_timer)\(", timer.read_text()))
        assert len(makers) == 1, f"{timer.name} defines {makers}"
        (maker,) = makers
        assert re.search(rf"\b{maker}\(", header), f"{maker} is not declared in the seam's header"
        assert maker in rows, f"{maker} has no row in make_op_timer's table"
        assert rows[maker] in backends.NAMES.values(), f"{rows[maker]} is not in backends.NAMES"
        assert timer.name in cmake, f"{timer.name} is in no CMake list the recipe names"
    assert len(rows) == len(timers)  # no row without its file


def test_every_record_kind_has_its_writer_section_and_fold_branch() -> None:
    items = recipe("Add a record kind")
    assert named(items, "contract/schema.py").read_text().count("RECORD_TYPES_V1") >= 1
    writers = " ".join(
        f.read_text()
        for end in ("src/llama-instr-<job>.cpp", "tools/llama-instr-<program>.h")
        for f in made_as(items, end)
    )
    headings = re.findall(r"^### (.*)$", named(items, "docs/schema.md").read_text(), re.M)
    fold = ast.parse(named(items, "session/fold.py").read_text())
    (apply,) = [n for n in ast.walk(fold) if isinstance(n, ast.FunctionDef) and n.name == "_apply"]
    branches = {
        c.value
        for n in ast.walk(apply)
        if isinstance(n, ast.Compare) and isinstance(n.left, ast.Name) and n.left.id == "rtype"
        for c in n.comparators
        if isinstance(c, ast.Constant)
    }
    kinds = schema.RECORD_TYPES_V1
    assert len(kinds) >= 20
    for kind in sorted(kinds):
        assert re.search(
            rf'(?:record_head\(\w+,|emit_session_record\(|llama_instr_write_record\()\s*"{kind}"',
            writers,
        ), f"no writer of {kind} in the files the recipe names"
        assert any(f"`{kind}`" in h for h in headings), f"docs/schema.md has no section of {kind}"
        assert kind in branches, f"fold._apply has no branch for {kind}"
    assert branches <= kinds, branches - kinds


def test_every_format_has_its_renderer_and_every_chart_kind_its_drawing() -> None:
    items = recipe("Add a report")
    registry = named(items, "renderers/__init__.py")
    for name in renderers.RENDERERS:
        assert (registry.parent / f"{name}.py").is_file(), f"renderer {name} has no module"
    assert set(renderers.RENDERERS) == {"text", "markdown", "csv", "json", "html"}
    model = ast.parse(named(items, "reports/report.py").read_text())
    (chart,) = [n for n in ast.walk(model) if isinstance(n, ast.ClassDef) and n.name == "Chart"]
    kinds = re.findall(r"^\s*- ``(\w+)``:", ast.get_docstring(chart) or "", re.M)
    assert len(kinds) >= 8, kinds
    svg = named(items, "renderers/svg.py").read_text()
    for kind in kinds:
        assert re.search(rf'kind (?:==|in) .*"{kind}"', svg), f"svg.py draws no {kind} chart"
    reports = made_as(items, "reports/<name>_report.py")
    assert len(reports) >= 5
    for f in reports:  # each builds a report or a section of one
        assert re.search(r"\b(?:Report|Section)\(", f.read_text()), f.name


def test_every_command_has_its_module_and_every_module_its_place() -> None:
    items = recipe("Add a command")
    commands_dir = named(items, "commands/<name>.py").parent
    assert "GROUPS" in named(items, "llamacpp_instr/cli.py").read_text()
    names = [n for group in cli.GROUPS.values() for n in group]
    modules = {}
    for name in names:
        module = commands_dir / f"{name.replace('-', '_')}.py"
        assert module.is_file(), f"instr {name} has no module {module.name}"
        tree = ast.parse(module.read_text())
        declared = {
            d.args[0].value
            for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef) and n.name == "command"
            for d in n.decorator_list
            if isinstance(d, ast.Call)
            and isinstance(d.func, ast.Attribute)
            and d.func.attr == "command"
            and d.args
            and isinstance(d.args[0], ast.Constant)
        }
        assert declared == {name}, f"{module.name} declares {declared}, not {name}"
        modules[module.name] = name
    shared = {
        Path(p).name
        for item in items
        for p in item.paths
        if p.startswith("llamacpp_instr/commands/")
    }
    shared.discard("<name>.py")
    for module in sorted(commands_dir.glob("*.py")):
        if module.name == "__init__.py":
            continue
        assert (
            module.name in modules or module.name in shared
        ), f"commands/{module.name} is neither a command's module nor one the recipe names"
    for name in shared:
        assert name not in modules, f"the recipe names the command module {name} as shared"


def test_every_kind_of_compute_has_its_event_its_tables_and_its_track() -> None:
    """Every ``Pass`` the decoder defines has its row of the fold's ``PASS_EVENTS``, an event of
    ``Event``, and a branch on that event where the tables are built and where the trace is laid
    out (the files the recipe names)."""
    items = recipe("Add a kind of compute")
    decoder = named(items, "reading/decode/passes.py").parent
    for module in sorted(decoder.glob("*.py")):  # (every kind the decoder defines, imported)
        importlib.import_module(f"llamacpp_instr.converters.reading.decode.{module.stem}")
    kinds = set(Pass.__subclasses__())
    assert {k.__name__ for k in kinds} >= {"Step", "Encode"}
    assert "PASS_EVENTS" in named(items, "session/fold.py").read_text()
    assert set(PASS_EVENTS) == kinds, "a kind of pass without its row of PASS_EVENTS"
    events = {e.__name__ for e in typing.get_args(Event)}
    assert {e.__name__ for e in PASS_EVENTS.values()} <= events
    for end in ("analysis/frames.py", "traces/layout.py"):
        tree = ast.parse(named(items, end).read_text())
        handled = {
            n.args[1].id
            for n in ast.walk(tree)
            if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Name)
            and n.func.id == "isinstance"
            and len(n.args) == 2
            and isinstance(n.args[1], ast.Name)
        }
        for kind, event in PASS_EVENTS.items():
            assert event.__name__ in handled, f"{end} reads no {event.__name__} ({kind.__name__})"


def test_a_step_is_written_by_the_one_writer_the_recipe_names() -> None:
    """Every kind of compute lives a step's life through the step writer the recipe names: no
    other overlay file writes the head of a ``step_begin`` or a ``step_end``, and a step's rows are
    cleared in one place (a kind with a copy of its own drifts from it: a kind of row its copy
    misses leaks into its next step). Each function the recipe's first item names is in a file it
    names."""
    first, *_ = recipe("Add a kind of compute")
    writer = named([first], "src/llama-instr-step.cpp")
    timing = named([first], "src/llama-instr-timing.cpp")
    heads: dict[str, list[str]] = {"step_begin": [], "step_end": []}
    clears: list[str] = []
    for path in sorted(writer.parent.glob("llama-instr*")):
        text = path.read_text(encoding="utf-8")
        for kind, where in heads.items():
            if re.search(rf'record_head\(\s*\w+\s*,\s*"{kind}"', text):
                where.append(path.name)
        clears += [path.name] * len(re.findall(r"\bp_computes\.clear\(\)", text))
    assert heads == {"step_begin": [writer.name], "step_end": [writer.name]}
    assert clears == [timing.name]
    named_texts = " ".join(
        f.read_text(encoding="utf-8") for p in first.paths for f in matches(p) if f.is_file()
    )
    functions = [t for t in re.findall(r"`(\w+)`", first.text) if "_" in t]
    assert len(functions) >= 6, functions
    for name in functions:
        assert re.search(
            rf"\b{name}\s*\(", named_texts
        ), f"no {name}( in the files the recipe names"


def test_the_patch_list_names_every_patch_of_the_series() -> None:
    """Section 1 describes each patch of ``patches/series``, and no other."""
    text = PAGE.read_text(encoding="utf-8")
    listed = re.findall(r"^- `((?:python/)?\d{4})` ", text, re.M)
    series = [
        line.split("-", 1)[0]
        for line in (ROOT / "patches" / "series").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert listed == series


def test_every_gpu_timer_has_the_shape_of_the_marks_header() -> None:
    """A backend whose timer puts device marks on the host's clock (its header names a clock
    pair) includes the shared header the recipe names and declares no clock pair of its own."""
    items = recipe("Add a backend's op timer")
    shared = named(items, "ggml-gpu-marks-instr.h")
    assert re.search(r"struct ggml_gpu_clock_pair\b", shared.read_text())
    headers = made_as(items, "ggml-<backend>-instr.h")
    gpus = [h for h in headers if "_clock_pair" in h.read_text() and h != shared]
    assert {h.name for h in gpus} >= {"ggml-cuda-instr.h", "ggml-vulkan-instr.h"}
    for h in gpus:
        text = h.read_text()
        assert f'#include "{shared.name}"' in text, f"{h.name} does not include {shared.name}"
        assert not re.search(r"struct ggml_\w+_clock_pair\s*\{", text), f"{h.name} has its own pair"
        assert not re.search(r"typedef \w+ \(\*ggml_backend_\w+_clock_pair_t\)", text), h.name
