"""Where the suite's time goes, per test file: `MODOPT_COMPILE_REPORT=1 python -m pytest -n 2`.

Most of the suite's CPU is JAX compiling small programs (tracing, lowering to MLIR, XLA's
backend compile). With the variable set, each test process records, per test, its wall time,
its process CPU time (all its threads), the CPU time of the subprocesses it ran and waited for
(`children`), and JAX's own durations of those three phases (`jax.monitoring` events); the
terminal summary adds a table by file, slowest first, and how long each process sat idle at
the end (a long test handed out last). A folder given as the variable keeps each process's
rows, per test with its start and end. CPU time, unlike wall time, hardly
depends on what else runs on the machine. A test whose wall time far exceeds its CPU and its
children's waits on I/O.
"""

from __future__ import annotations

import collections
import json
import os
import pathlib
import resource
import shutil
import tempfile
import time

import jax
import pytest

VARIABLE = "MODOPT_COMPILE_REPORT"
# JAX's events, by the column that shows their seconds (and their count, for backend compiles).
PHASES = {
    "trace": "/jax/core/compile/jaxpr_trace_duration",
    "lower": "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "compile": "/jax/core/compile/backend_compile_duration",
}


class CompileReport:
    """The pytest plugin: registered by `conftest.py` in the controller and in every worker."""

    def __init__(self, directory: pathlib.Path, temporary: bool):
        self.directory, self.temporary = directory, temporary
        self.seconds: collections.Counter = collections.Counter()
        self.rows: list[dict] = []
        jax.monitoring.register_event_duration_secs_listener(self._record)

    def _record(self, event: str, duration: float, **_) -> None:
        self.seconds[event] += duration
        self.seconds[event + "#"] += 1

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item):
        before, wall, cpu, children = dict(self.seconds), time.perf_counter(), time.process_time(), _children()
        start = time.time()
        yield
        row = {"test": item.nodeid, "start": start, "end": time.time()}
        row.update(wall=time.perf_counter() - wall, cpu=time.process_time() - cpu)
        row["children"] = _children() - children
        for column, event in PHASES.items():
            row[column] = self.seconds[event] - before.get(event, 0.0)
        row["programs"] = self.seconds[PHASES["compile"] + "#"] - before.get(PHASES["compile"] + "#", 0)
        self.rows.append(row)

    def pytest_sessionfinish(self, session):
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        (self.directory / f"{worker}.json").write_text(json.dumps(self.rows))

    def pytest_terminal_summary(self, terminalreporter):
        by_file: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        ends = {}  # per process, when its last test ended
        for path in self.directory.glob("*.json"):
            for row in json.loads(path.read_text()):
                ends[path.stem] = max(ends.get(path.stem, 0.0), row.pop("end"))
                del row["start"]
                totals = by_file[row.pop("test").split("::")[0]]
                totals.update(row)
                totals["tests"] += 1
        if not by_file:
            return
        columns = ("tests", "wall", "cpu", "children", "programs", "compile", "lower", "trace")
        write = terminalreporter.write_line
        terminalreporter.section("where the time goes (seconds summed over tests, by file)")
        write(f"{'file':48} " + " ".join(f"{c:>8}" for c in columns))
        everything: collections.Counter = collections.Counter()
        for file, totals in sorted(by_file.items(), key=lambda item: -item[1]["wall"]):
            everything.update(totals)
            write(f"{file:48} " + " ".join(_cell(totals[c]) for c in columns))
        write(f"{'all':48} " + " ".join(_cell(everything[c]) for c in columns))
        # A process that ran out of tests while another still ran one: cores left idle at the end.
        write("idle at the end: " + ", ".join(f"{w} {max(ends.values()) - end:.0f} s" for w, end in sorted(ends.items())))

    def pytest_unconfigure(self, config):
        if self.temporary and "PYTEST_XDIST_WORKER" not in os.environ:  # the controller, last
            shutil.rmtree(self.directory, ignore_errors=True)


def _children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _cell(value: float) -> str:
    return f"{value:8.0f}" if float(value).is_integer() else f"{value:8.1f}"


def register(config) -> None:
    """Registers the report; `MODOPT_COMPILE_REPORT` is `1` (a temporary folder that the
    controller creates and its workers inherit) or a folder that keeps each process's rows."""
    setting = os.environ[VARIABLE]
    temporary = setting == "1"
    if temporary:
        setting = os.environ[VARIABLE] = tempfile.mkdtemp(prefix="modopt-compile-report-")
    directory = pathlib.Path(setting)
    directory.mkdir(parents=True, exist_ok=True)
    if "PYTEST_XDIST_WORKER" not in os.environ:  # the controller: a kept folder's rows of an earlier run go
        for stale in directory.glob("*.json"):
            stale.unlink()
    config.pluginmanager.register(CompileReport(directory, temporary), "modopt-compile-report")
