"""No test sleeps and then asserts (issue #22). A check after a fixed sleep passes or fails with the
machine's load, not with the code: unit and integration tests take time from the injected clock, e2e
and reliability tests poll through `tests.waiting` (`wait_for`, or `holds_for` for "nothing happens
for N seconds").

This scans every Python file under tests/ (but tests/waiting.py, whose polling is the one allowed
sleep) for a function that calls `time.sleep` or `asyncio.sleep` (however imported) and then checks
something: an `assert`, a `pytest.fail(...)`, or a `return` of a verdict, after the sleep in the
function's text, or anywhere in a loop around the sleep. A sleep that paces load (a burst's creations,
a client sending one byte at a time) checks nothing in its function and passes.
"""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
THE_WAIT_HELPER = TESTS / "waiting.py"
SLEEPING_MODULES = {"time", "asyncio"}


@dataclass(frozen=True)
class Finding:
    where: str
    function: str
    sleep_line: int
    check_line: int

    def __str__(self) -> str:
        return f"{self.where}:{self.sleep_line}: {self.function} sleeps, then checks at line {self.check_line}"


def _sleep_names(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(names bound to the time/asyncio modules, names bound to their `sleep` itself)."""
    modules, sleeps = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.asname or a.name for a in node.names if a.name in SLEEPING_MODULES}
        elif isinstance(node, ast.ImportFrom) and node.module in SLEEPING_MODULES:
            sleeps |= {a.asname or a.name for a in node.names if a.name == "sleep"}
    return modules, sleeps


def _is_sleep(node: ast.AST, modules: set[str], sleeps: set[str]) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    if isinstance(f, ast.Attribute) and f.attr == "sleep" and isinstance(f.value, ast.Name):
        return f.value.id in modules
    return isinstance(f, ast.Name) and f.id in sleeps


def _is_check(node: ast.AST) -> bool:
    if isinstance(node, ast.Assert):
        return True
    if isinstance(node, ast.Return):
        return node.value is not None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr == "fail" and isinstance(node.func.value, ast.Name) and node.func.value.id == "pytest"
    return False


def _own_nodes(function: ast.AST) -> list[tuple[ast.AST, tuple[ast.AST, ...]]]:
    """The nodes of `function` outside its nested functions and classes, each with its enclosing loops."""
    out: list[tuple[ast.AST, tuple[ast.AST, ...]]] = []

    def visit(node: ast.AST, loops: tuple[ast.AST, ...]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                continue
            out.append((child, loops))
            visit(child, loops + ((child,) if isinstance(child, (ast.For, ast.AsyncFor, ast.While)) else ()))

    visit(function, ())
    return out


def sleeps_then_checks(source: str, where: str = "<source>") -> list[Finding]:
    tree = ast.parse(source)
    modules, sleeps = _sleep_names(tree)
    findings = []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        nodes = _own_nodes(function)
        checks = [(n, loops) for n, loops in nodes if _is_check(n)]
        for sleep, loops in nodes:
            if not _is_sleep(sleep, modules, sleeps):
                continue
            end = (sleep.end_lineno or sleep.lineno, sleep.end_col_offset or 0)
            in_a_loop = {id(loop) for loop in loops}
            for check, check_loops in checks:
                after = (check.lineno, check.col_offset) > end
                same_loop = bool(in_a_loop & {id(loop) for loop in check_loops})
                if after or same_loop:
                    findings.append(Finding(where, function.name, sleep.lineno, check.lineno))
                    break
    return findings


def test_no_test_sleeps_and_then_asserts() -> None:
    findings = []
    for path in sorted(TESTS.rglob("*.py")):
        where = path.relative_to(TESTS).as_posix()
        if path == THE_WAIT_HELPER:
            continue
        findings += sleeps_then_checks(path.read_text(), where)
    assert findings == [], "poll through tests.waiting (wait_for / holds_for) or use the injected clock:\n" + "\n".join(map(str, findings))


SLEEPS_THEN_CHECKS = {
    "assert after a sleep": """
        import time
        def test_x():
            time.sleep(3)
            assert done()
    """,
    "asyncio's sleep, awaited": """
        import asyncio
        async def test_x():
            await asyncio.sleep(1)
            assert done()
    """,
    "sleep imported by name, under another name": """
        from time import sleep as nap
        def test_x():
            nap(1)
            if not done():
                pytest.fail("not done")
    """,
    "module under another name, check in a nested block": """
        import time as clock
        def test_x():
            with open_thing():
                clock.sleep(1)
            for item in items():
                assert item
    """,
    "a helper that sleeps, then returns its verdict": """
        import time
        def stays(pod):
            time.sleep(8)
            return read(pod) is not None
    """,
    "a hand-written poll: the check comes first in the loop's text": """
        import time
        def test_x():
            while True:
                if done():
                    return True
                time.sleep(0.1)
    """,
}

PACES_WITHOUT_CHECKING = {
    "load paced by a sleep": """
        import time
        def submit(names):
            for name in names:
                pool.submit(create, name)
                time.sleep(0.05)
    """,
    "the check is before the sleep, outside any loop": """
        import time
        def test_x():
            assert ready()
            time.sleep(1)
            stop()
    """,
    "a sleep inside a nested function, the check in the outer one": """
        import time
        def test_x():
            def pace():
                time.sleep(1)
            start(pace)
            assert wait_for("done", done)
    """,
    "a sleep in a string (a script for another process)": """
        SCRIPT = "import time\\ntime.sleep(600)\\nassert False\\n"
        def test_x():
            assert run(SCRIPT)
    """,
    "something else called sleep": """
        def test_x(clock):
            clock.sleep(5)
            assert clock.now() == 5
    """,
}


@pytest.mark.parametrize("source", SLEEPS_THEN_CHECKS.values(), ids=SLEEPS_THEN_CHECKS.keys())
def test_the_scan_finds_a_sleep_then_a_check(source: str) -> None:
    assert len(sleeps_then_checks(textwrap.dedent(source))) == 1


@pytest.mark.parametrize("source", PACES_WITHOUT_CHECKING.values(), ids=PACES_WITHOUT_CHECKING.keys())
def test_the_scan_lets_a_sleep_that_checks_nothing_pass(source: str) -> None:
    assert sleeps_then_checks(textwrap.dedent(source)) == []
