"""The suite's time budget, as a pytest plugin (loaded by tests/conftest.py).

- A test whose setup and call take more than `slow_test_seconds` (setup.cfg) of wall time fails under
  `--cpu-budget` unless it carries `@pytest.mark.slow_reason("why it cannot be shorter")`.
- Every test's CPU time (this process and the children it waited for) is recorded; with
  `--cpu-budget` (`make test`) the ten slowest tests are printed with their reasons, then the ten
  that used the most CPU, and the run fails when the total CPU time is over `cpu_budget_seconds`
  (setup.cfg), the one place the limit is written. Under pytest-xdist each worker measures its own
  tests and sends the figures to the controller with the test's report.
- A child is counted by the test that waits for it, whoever started it: Python reaps a finished
  subprocess it no longer holds at its next Popen, multiprocessing a finished Process at its next
  start, so a test can reap another's vLLM engine. What a child had used before the test began is
  taken out (its CPU from /proc at the test's start): a 1-second test was once charged 62 CPU-s
  of an earlier test's engine and failed the slow rule (full run 29).
- That figure misses what no test waits for: Slurm jobs (slurmd's children), local jobs left
  orphans in groups of their own, daemons (about 60 % of the machine's CPU in a full run,
  docs/figures.md). So the controller also reads the machine's CPU time (`/proc/stat`: user + nice +
  system over every core) from the session's start to its end, and with `--cpu-budget` the run fails
  when that is over `machine_cpu_budget_seconds` (setup.cfg; 0: not checked, and where there is no
  `/proc/stat`). It counts everything on the machine, so it is measured with nothing else running.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
from pathlib import Path

import pytest

SLOW_TEST_INI = "slow_test_seconds"
CPU_BUDGET_INI = "cpu_budget_seconds"
MACHINE_BUDGET_INI = "machine_cpu_budget_seconds"
PROC_STAT = Path("/proc/stat")
_CPU = "budget_cpu_s"
_WALL = "budget_wall_s"
_REASON = "budget_slow_reason"
_SETUP_S = pytest.StashKey[float]()
_CPU0 = pytest.StashKey[float]()
_KIDS0 = pytest.StashKey[dict[str, float]]()
_BUDGET = pytest.StashKey["Budget"]()


def _cpu_now() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _children() -> list[str]:
    """The pids of this process's children, zombies too (not yet reaped); none where /proc has no
    children lists."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return []
    pids: list[str] = []
    for tid in tasks:
        with contextlib.suppress(OSError):
            pids += Path(f"/proc/self/task/{tid}/children").read_text().split()
    return pids


def _children_cpu() -> dict[str, float]:
    """This process's children and the CPU each has used so far, its own and its reaped children's,
    as RUSAGE_CHILDREN will count it once this process reaps it."""
    kids: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for pid in _children():
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{pid}/stat").read_text()
            fields = stat[stat.rfind(")") + 2:].split()  # fields 3...: utime, stime, cutime, cstime are 14-17
            kids[pid] = sum(int(v) for v in fields[11:15]) / tick
    return kids


def _test_cpu(item: pytest.Item) -> float:
    """The CPU this process and the children it reaped used since the test began, less what those
    children had used before it (an earlier test's, reaped during this one)."""
    before = item.stash.get(_KIDS0, {})
    gone = before.keys() - set(_children())
    # never below 0: a child reaped by the kernel (SIGCHLD ignored) was never added
    return max(0.0, _cpu_now() - item.stash.get(_CPU0, _cpu_now()) - sum(before[pid] for pid in gone))


def machine_cpu_seconds(stat: Path = PROC_STAT) -> float | None:
    """The CPU time every core has spent since boot (user + nice + system), or None without /proc/stat."""
    try:
        fields = stat.read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if not fields or fields[0] != "cpu":
        return None
    return sum(int(v) for v in fields[1:4]) / os.sysconf("SC_CLK_TCK")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(SLOW_TEST_INI, "a test using more CPU seconds than this (setup + call) needs slow_reason",
                  default="60")
    parser.addini(CPU_BUDGET_INI, "the whole suite's CPU-time limit in seconds (checked with --cpu-budget)",
                  default="0")
    parser.addini(MACHINE_BUDGET_INI, "the machine's CPU-time limit in seconds over the whole run, every process "
                  "counted (checked with --cpu-budget)", default="0")
    parser.addoption("--budget-json", metavar="PATH", default=None,
                     help="write every test's CPU seconds, wall seconds and slow reason to PATH (JSON), "
                          "to see where the budget goes beyond the ten printed")
    parser.addoption("--cpu-budget", action="store_true",
                     help="print the ten slowest tests and fail when the total CPU time is over cpu_budget_seconds, "
                          "or the machine's over machine_cpu_budget_seconds")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow_reason(reason): why this test may take longer than slow_test_seconds")
    config.stash[_BUDGET] = Budget(config)
    config.pluginmanager.register(config.stash[_BUDGET], "ggpo-budget")


class Budget:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.limit_s = float(config.getini(SLOW_TEST_INI))
        self.cpu_budget_s = float(config.getini(CPU_BUDGET_INI))
        self.machine_budget_s = float(config.getini(MACHINE_BUDGET_INI))
        self.tests: dict[str, tuple[float, float, str]] = {}  # nodeid -> (cpu s, wall s, slow reason)
        self.machine_start_s: float | None = None
        # the machine's CPU seconds over the session: read once, in pytest_sessionfinish, which the
        # terminal summary follows, so the exit status and the printed verdict agree
        self.machine_s: float | None = None

    def checks(self) -> bool:
        """Whether this process keeps the budget: the controller (or a run without xdist) under --cpu-budget."""
        return bool(self.config.getoption("cpu_budget")) and not hasattr(self.config, "workerinput")

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        if self.checks():
            self.machine_start_s = machine_cpu_seconds()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None):  # type: ignore[no-untyped-def]
        item.stash[_KIDS0] = _children_cpu()
        item.stash[_CPU0] = _cpu_now()
        return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
        report = yield
        if report.when == "setup":
            item.stash[_SETUP_S] = report.duration
        elif report.when == "call":
            wall = item.stash.get(_SETUP_S, 0.0) + report.duration
            # The rule counts the test's own CPU seconds (setup + call, its children included), not its
            # wall time: with more xdist workers than cores, or a busy host, wall time stretches by
            # the load and a wall rule fails tests by chance; CPU time is what the suite's budget spends.
            cpu = _test_cpu(item)
            marker = item.get_closest_marker("slow_reason")
            reason = str(marker.args[0]) if marker and marker.args else ""
            # failed under --cpu-budget (make test); a targeted run only lists it in the summary
            if cpu > self.limit_s and not reason and report.passed and item.config.getoption("cpu_budget"):
                report.outcome = "failed"
                report.longrepr = (f"used {cpu:.0f} CPU s (setup + call; {wall:.0f} s wall), over {SLOW_TEST_INI} = "
                                   f"{self.limit_s:g} (setup.cfg), with no @pytest.mark.slow_reason(\"...\") saying why")
            report.user_properties.append((_WALL, wall))
            report.user_properties.append((_REASON, reason))
        elif report.when == "teardown":
            report.user_properties.append((_CPU, _test_cpu(item)))
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # on the controller too: xdist replays each worker's reports here, user_properties included
        props = dict(report.user_properties)
        cpu, wall, reason = self.tests.get(report.nodeid, (0.0, 0.0, ""))
        if report.when == "call":
            wall, reason = float(props.get(_WALL, 0.0)), str(props.get(_REASON, ""))
        elif report.when == "teardown":
            cpu = float(props.get(_CPU, 0.0))
        self.tests[report.nodeid] = (cpu, wall, reason)

    @property
    def total_cpu_s(self) -> float:
        return sum(cpu for cpu, _, _ in self.tests.values())

    def over_budget(self) -> bool:
        return self.cpu_budget_s > 0 and self.total_cpu_s > self.cpu_budget_s

    def machine_over_budget(self, machine_s: float | None) -> bool:
        return self.machine_budget_s > 0 and machine_s is not None and machine_s > self.machine_budget_s

    def pytest_terminal_summary(self, terminalreporter, exitstatus: int, config: pytest.Config) -> None:  # type: ignore[no-untyped-def]
        if not self.checks():
            return
        tr = terminalreporter
        tr.section("time budget (tests/support/budget.py)")
        slowest = sorted(self.tests.items(), key=lambda kv: kv[1][1], reverse=True)[:10]
        for nodeid, (cpu, wall, reason) in slowest:
            tr.write_line(f"{wall:7.1f} s wall {cpu:7.1f} s CPU  {nodeid}" + (f"  -- {reason}" if reason else ""))
        # What the budget spends: a test's own CPU (its process's share of the test and the children it
        # waited for; Slurm's job steps and forked ranks are counted on the machine's figure below).
        tr.write_line("the ten that used the most CPU:")
        for nodeid, (cpu, wall, _reason) in sorted(self.tests.items(), key=lambda kv: kv[1][0], reverse=True)[:10]:
            tr.write_line(f"{cpu:7.1f} s CPU  {wall:7.1f} s wall {nodeid}")
        for nodeid, (cpu, _wall, reason) in self.tests.items():
            if cpu > self.limit_s and not reason:
                tr.write_line(f"over {SLOW_TEST_INI} with no slow_reason: {nodeid} ({cpu:.0f} CPU s)")
        verdict = "OVER" if self.over_budget() else "within"
        tr.write_line(f"total CPU time of {len(self.tests)} tests: {self.total_cpu_s:.0f} s, {verdict} "
                      f"{CPU_BUDGET_INI} = {self.cpu_budget_s:g} (setup.cfg)")
        machine_s = self.machine_s
        if machine_s is None:
            tr.write_line("the machine's CPU time: not measured (no /proc/stat)")
        else:
            verdict = "OVER" if self.machine_over_budget(machine_s) else "within"
            tr.write_line(f"the machine's CPU time during the run (every process: Slurm jobs, orphaned local jobs, "
                          f"daemons): {machine_s:.0f} s, {verdict} {MACHINE_BUDGET_INI} = "
                          f"{self.machine_budget_s:g} (setup.cfg)")

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if hasattr(self.config, "workerinput"):
            return
        path = self.config.getoption("budget_json")
        if path:
            rows = [{"test": nodeid, "cpu_s": round(cpu, 2), "wall_s": round(wall, 2), "slow_reason": reason}
                    for nodeid, (cpu, wall, reason) in sorted(self.tests.items(), key=lambda kv: -kv[1][0])]
            Path(path).write_text(json.dumps({"tests": rows, "total_cpu_s": round(self.total_cpu_s, 1)}, indent=1))
        if not self.checks():
            return
        now = machine_cpu_seconds()
        if now is not None and self.machine_start_s is not None:
            self.machine_s = now - self.machine_start_s
        if (self.over_budget() or self.machine_over_budget(self.machine_s)) and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

