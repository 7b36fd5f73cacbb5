"""docs/reliability.md from the reliability suite's own figures.

    python tests/reliability/report.py                      # run the suite, then write docs/reliability.md
    python tests/reliability/report.py --figures FILE       # only render FILE (a previous run's figures)
    python tests/reliability/report.py --update FILE...     # run these test files, replace their rows in the page

Running: `pytest -m reliability tests/reliability` with EGRESS_PLACER_RELIABILITY_FIGURES pointing at a
JSON file, into which the suite's conftest writes one row per test (fault, load, expected and measured
outcome, runs misplaced or lost, pass/fail, and for the intrusion tests one line per attempt). Then the
Markdown tables are rendered from that file, with the run's date, duration and machine. Exit status:
pytest's (the page is written either way, failures included, so it never shows better than the run).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

REPO = Path(__file__).resolve().parents[2]
FIGURES_ENV = "EGRESS_PLACER_RELIABILITY_FIGURES"
OUT = REPO / "docs" / "reliability.md"
COMMAND = "python tests/reliability/report.py"
RESULT = {"passed": "pass", "failed": "**FAIL**", "xfailed": "known gap (xfail)", "xpassed": "**XPASS** (gap closed?)", "skipped": "skipped"}

NOTES = """\
## Decisions and known gaps

- **Fail-open.** The webhooks have `failurePolicy: Ignore`: while no replica answers, runs are created
  unplaced and run on ordinary nodes (the pool taints keep every pod without the toleration off the pool).
  A restarted controller reports each run it missed (Warning Event `NotAdmitted`, one log line each).
  A pod that carries the pool toleration itself is not stripped while admission is away, reaches the pool
  and is evicted by the leader (at once if the leader runs, on its return otherwise).
- **In-flight reviews at a replica's death.** A review the API server had sent to a replica that is killed
  at that instant fails and is admitted unchanged (the API server does not retry a POST on a broken
  connection). The leader-failover test counts these from the API server's log (its row gives the count)
  and checks that each such run's pod was still placed at Pod admission.
- **Exempt namespaces are trusted** (default `kube-system`, `kube-node-lease`, `kube-public`): only cluster
  administrators create pods there. A pod there with the toleration stays on the pool, by design.
- **Node agents are resolved, not believed.** A pod gets every pool toleration at admission, and is never an
  intruder, only when its controller owner resolves by uid in the controller's DaemonSet cache to an
  `apps/v1` DaemonSet of the same namespace and name, and that namespace is an agent namespace
  (`agentNamespaces`, by default the exempt namespaces). A tenant with the `edit` role may create a real
  DaemonSet in its own namespace, or claim any owner (an `extensions/v1beta1` DaemonSet with a made-up uid,
  which the garbage collector cannot resolve and so never deletes): neither makes a node agent. The same
  functions (`controller/intruders/core.py`) decide at admission and in the intruder check. What puts node
  agents on pool nodes is the toleration in their DaemonSet's pod template, added at admission for agent
  namespaces only (the DaemonSet controller makes no pod on a node its template does not tolerate;
  kube-system's pods do not reach the pod webhook at all): [docs/node-agents.md](node-agents.md).
- **Mirror pods** are trusted only with the annotation `kubernetes.io/config.mirror` AND a controller owner
  `v1` Node that is the pod's own node, with that node's uid (what a kubelet must write under
  NodeRestriction; the `edit` role cannot read Nodes). Before this suite, the annotation alone was trusted:
  anyone could forge it and stay on a pool node for good; until the hostile-tenant test, admission still
  left a pod with the forged annotation unchanged.
- **nodeName skips the scheduler, and with it the pool taint.** A pod created with the `nodeName` of a pool
  node its namespace may not use loses that `nodeName` at admission (a warning says so) and goes to the
  scheduler: a StatefulSet pinning its pod to a pool node no longer gets it there, re-created or not.
- **Evicted means gone.** An intruder's eviction gives its containers its own grace, at most
  `EGRESS_PLACER_INTRUDER_EVICTION_GRACE_SECONDS` (10 s by default, 2 s in the hostile-tenant test): a day's
  `terminationGracePeriodSeconds` and a process that ignores SIGTERM no longer keep the node. One still
  there a second after that grace is deleted with grace 0 (uid as precondition; Event
  `IntruderDeletedAfterGrace`). A terminating intruder (the tenant's own delete with a day's grace) is still
  an intruder: the eviction shortens its grace. Intruders are tracked by uid until gone, so a pod re-created
  under the same name is a new intruder at once; Event `IntruderRemoved` and
  `egress_placer_intruders_removed_total{step}` say which step removed each one. The local cluster's KWOK
  removes a deleted pod at once, except pods labelled `devcluster.egress-placer.io/honour-grace`, which it
  keeps until their deletion's grace is over (how the tests make the day's grace real), or for ever with the
  value `never` (a node that never confirms: only the delete with grace 0 removes such a pod).
- **An UPDATE adding the pool toleration** is not seen by the mutating webhook (CREATE only): such a pod
  reaches the pool and is evicted as an intruder (figures above). The ValidatingAdmissionPolicy of the pool
  guard (separate work) refuses that UPDATE in the API server.
- **An intruder protected by its own PodDisruptionBudget** has its evictions refused (the Eviction API
  honours budgets; metric `egress_placer_intruder_evictions_total{outcome="deferred"}`), and the leader tries
  again every 5 s. Once they have been refused for `EGRESS_PLACER_INTRUDER_BUDGET_GRACE_SECONDS` (default 30 s;
  5 s in this suite) it deletes the pod with the same capped grace (Event `IntruderDeletedPastBudgetGrace`,
  outcome `deleted-past-budget-grace`): a budget keeps a workload available where it may run, it does not
  entitle a pod to a pool node. This needs `pods: delete` in the ClusterRole; the setting `never` honours
  budgets for ever (and the pod stays).
- **Namespaces cannot be renamed**: `rel-team-cdn-evil` (created for the test) matches no namespace glob of the policy
  and is treated like any other namespace that may not use the pool.
- **After an API server restart** the first requests may get 403 until the API server's RBAC caches sync: the
  controller's informers retry with backoff (watch restarts counted).
- **Under sustained 429s** each write is tried 6 times, never sooner than `Retry-After`, then left to the next
  reconcile pass (taints and evictions are level-based, so they converge once the API server answers). The
  leader steps down when its lease renewals are refused for the renew deadline and takes the lease back
  afterwards. Events are best effort: one refused 6 times is given up (log line `event not written`).
- **Runs whose params explode.** Tekton substitutes param defaults that refer to other params (v1.15.0,
  `replacementsFromDefaultParams`, second pass), so a Task whose defaults each repeat the previous param twice
  turns a 1.2 KB TaskRun into a 4 MiB image, 64 MiB with four params more; a matrix multiplies its values.
  Before the caps, admitting 16 levels took 0.3 s of CPU and 37 MiB and wrote the 4 MiB image into the run's
  decision, 20 levels 4.2 s of CPU and 470 MiB; a 64^4 matrix, a chain of 60,000 defaults and 1,000 pipeline
  tasks on a Task of 20,000 params did not finish in 60 s (`python -m bench.hostile`, `Admission.review` in
  memory). Image discovery now works within caps checked before any string is built (config/settings.md,
  "Bounds of image discovery"): those inputs take 1 ms, 1 ms, 1 ms, 119 ms and 25 ms of CPU and no memory to
  speak of, and no review under 3 MiB costs more than about 250 ms of CPU. Past a cap the run is `unresolved`
  and placed at Pod CREATE from the pod's images, which have the same length cap. Reviews over 64 KiB are
  answered in a worker thread, so `/healthz` and ordinary reviews are not queued behind them. Tekton's own
  controller, given the same runs: the matrix bomb fails `PipelineValidationFailed` (more than its 256
  combinations); the run just past the image cap gets its pod (unresolved at Pod admission, so on an ordinary
  node) and succeeds; with 16 levels Tekton builds the 4 MiB pod, the API server refuses it (request larger
  than 3 MiB), so does the status update, and Tekton retries it with backoff without ever failing the run
  (its controller stayed up, RSS 66 to 110 MiB over 2 minutes).
- **Tekton fails a TaskRun whose pod creation the API server refused during the outage** (it treats that
  error as final: tektoncd/pipeline#3902, #10724). Such runs are counted apart ("failed by Tekton before any
  pod"), not as lost or misplaced by egress-placer, after checking that their podTemplate carries the placement.
- **etcd restart**: the API server keeps its watch caches, so the controller's watches need not restart; the
  API server holds most requests until etcd is back (few creations had to be retried).
"""


def run_suite(figures: Path, pytest_args: Sequence[str], tests: Sequence[str] = ("tests/reliability",)) -> tuple[int, float]:
    env = {**os.environ, FIGURES_ENV: str(figures)}
    argv = [sys.executable, "-m", "pytest", "-m", "reliability", *tests, "-p", "no:cacheprovider", *pytest_args]
    started = time.monotonic()
    status = subprocess.call(argv, cwd=REPO, env=env)
    return status, time.monotonic() - started


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _seconds(value: float | None) -> str:
    if value is None:
        return "not stopped"
    return "at admission" if value == 0 else f"{value:.1f} s"


def _fault_line(row: dict[str, Any]) -> str:
    if "fault" not in row:  # failed before it said what it tests
        row = {**row, "fault": row["nodeid"].split("::")[-1], "load": "", "expected": ""}
    measured = row.get("measured") or "(nothing measured)"
    if row.get("failure") and row.get("outcome") in ("failed", "xfailed"):
        measured += f" -- {row['failure']}"
    lost = row.get("lost", "?")
    return (
        f"| {_cell(row['fault'])} | {_cell(row['load'])} | {_cell(row['expected'])} | {_cell(measured)} | {lost} "
        f"| {RESULT.get(row.get('outcome', ''), row.get('outcome', 'not run'))} | {row.get('seconds', 0):.0f} s |"
    )


def _attempts_section(rows: list[dict[str, Any]]) -> list[str]:
    attempts = [a for row in rows for a in row.get("attempts", [])]
    if not attempts:
        return []
    out = [
        "## Getting onto the pool without permission",
        "",
        "| attempt | outcome | time to stop | stopped |",
        "|---|---|---|---|",
    ]
    for a in attempts:
        stopped = "yes" if a["stopped"] else "**no**"
        if a["seconds"] is None and a["stopped"]:
            stopped, seconds = "trusted by design", "-"
        else:
            seconds = _seconds(a["seconds"])
        out.append(f"| {_cell(a['attempt'])} | {_cell(a['outcome'])} | {seconds} | {stopped} |")
    return out


def _attacks_section(rows: list[dict[str, Any]]) -> list[str]:
    attacks = [a for row in rows for a in row.get("attacks", [])]
    if not attacks:
        return []
    out = [
        "## A hostile tenant",
        "",
        "A minted identity bound to the built-in `edit` ClusterRole in its own namespace only (one that may not",
        "use the pool), every attack at once in one shared window, the API sampled every 0.5 s",
        "(`tests/reliability/test_hostile_tenant.py`). Time until cleared: how long its longest-lived pod was seen",
        'Running on a pool node ("at admission": none ever got there).',
        "",
        "| attack | who may do it (RBAC) | outcome | time until cleared | most seconds Running on a pool node in 60 s | held |",
        "|---|---|---|---|---|---|",
    ]
    for a in attacks:
        cleared = "at admission" if not a["cleared_after"] else f"{a['cleared_after']:.1f} s"
        held = "yes" if a["held"] else "**no**"
        out.append(
            f"| {_cell(a['attack'])} | {_cell(a['rbac'])} | {_cell(a['outcome'])} | {cleared} | {a['worst_window']:.1f} s | {held} |"
        )
    return out


def render(rows: list[dict[str, Any]], *, duration: float | None, when: str) -> str:
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.get("outcome", "not run")] = counts.get(row.get("outcome", "not run"), 0) + 1
    summary = ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items()))
    took = f" {duration:.0f} s" if duration is not None else ""
    out = [
        "# Reliability and security: counted outcomes on the local cluster",
        "",
        f"Generated by `{COMMAND}` (the Makefile's `reliability` target) on {when}: the suite took{took or ' ?'}, "
        f"local cluster start included; {len(rows)} measured tests ({summary}) on {os.cpu_count()} CPUs, "
        f"{platform.system()} {platform.machine()}, Python {platform.python_version()}.",
        "Every figure is what that run measured; each row is a test in `tests/reliability/` that fails when its outcome is wrong.",
        "The faults are real: processes of the local cluster (`devcluster/`) killed with SIGKILL and started again with",
        "the same argv (`devplacer/faults.py`), the API server restarted with other flags, two controller replicas",
        "behind a round-robin proxy (`devplacer/webhook_proxy.py`) as behind a Service.",
        "",
        "## Faults",
        "",
        "| fault | load during it | expected outcome | measured outcome | runs misplaced or lost | result | test time |",
        "|---|---|---|---|---|---|---|",
        *(_fault_line(row) for row in rows),
    ]
    for section in (_attempts_section(rows), _attacks_section(rows)):
        if section:
            out += ["", *section]
    out += ["", NOTES]
    return "\n".join(out).rstrip() + "\n"


UPDATED = "Re-measured by `"


def update(page: str, rows: list[dict[str, Any]], *, tests: Sequence[str], duration: float | None, when: str) -> str:
    """`page` with the rows of the tests that ran replaced (a fault row by its fault, the attempt and
    hostile-tenant tables whole) and the notes current; every other row stays from its own run, and the
    header says which rows were measured when."""
    sections: dict[str, list[str]] = {}
    order: list[str] = []
    current = ""
    for line in page.rstrip("\n").split("\n"):
        if line.startswith("## "):
            current = line
            order.append(current)
        sections.setdefault(current, []).append(line)
    took = f" in {duration:.0f} s" if duration is not None else ""
    note = (
        f"{UPDATED}{COMMAND} --update` on {when}{took}: the rows of {', '.join(f'`{t}`' for t in tests)} "
        "(those tests only); every other row is from the run above."
    )
    # An earlier re-measurement stays said unless every file it names was measured again now.
    header = [
        line for line in sections[""]
        if not (line.startswith(UPDATED) and set(re.findall(r"`(tests/[^`]+)`", line)) <= set(tests))
    ]
    blank = max(i for i, line in enumerate(header) if line.strip()) + 1
    sections[""] = header[:blank] + [note] + header[blank:]
    faults = sections.get("## Faults", [])
    for row in rows:
        line = _fault_line(row)
        key = line.split(" | ", 1)[0]
        match = [i for i, old in enumerate(faults) if old.split(" | ", 1)[0] == key]
        if match:
            faults[match[0]] = line
        else:
            last = max(i for i, old in enumerate(faults) if old.startswith("| "))
            faults.insert(last + 1, line)
    for section in (_attempts_section(rows), _attacks_section(rows)):
        if section:
            if section[0] not in sections:
                order.insert(order.index(next(h for h in order if h.startswith("## Decisions"))), section[0])
            sections[section[0]] = section + [""]
    notes = NOTES.rstrip("\n").split("\n")
    sections[notes[0]] = notes
    if notes[0] not in order:
        order.append(notes[0])
    out = sections[""] + [line for heading in order for line in sections[heading]]
    return "\n".join(out).rstrip() + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--figures", type=Path, help="render this figures file instead of running the suite")
    parser.add_argument("--out", type=Path, default=OUT, help=f"where to write the page (default {OUT.relative_to(REPO)})")
    parser.add_argument(
        "--update",
        nargs="+",
        metavar="TEST_FILE",
        help="run only these test files and replace their rows in the existing page (the others stay from their run)",
    )
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)
    status, duration = 0, None
    if args.figures is None:
        with tempfile.TemporaryDirectory(prefix="reliability-") as tmp:
            figures = Path(tmp) / "figures.json"
            status, duration = run_suite(figures, args.pytest_args, args.update or ("tests/reliability",))
            if not figures.exists():
                print("report: the suite recorded no figures; page not written", file=sys.stderr)
                return status or 1
            rows = json.loads(figures.read_text())
    else:
        rows = json.loads(args.figures.read_text())
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if args.update:
        page = update(args.out.read_text(), rows, tests=args.update, duration=duration, when=when)
    else:
        page = render(rows, duration=duration, when=when)
    args.out.write_text(page)
    print(f"report: wrote {args.out} ({len(rows)} tests)")
    return status


if __name__ == "__main__":
    sys.exit(main())
