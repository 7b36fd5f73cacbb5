"""The launcher's boundary (no cluster needed): devcluster/ imports nothing of egress-placer, which
reaches its command line through entry points with the same options as ever; tools keep their state
through `Cluster`'s public API; one PKI per side; `up`'s test for a port taken under it."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from devcluster.__main__ import parser
from devcluster.cluster import Cluster, ClusterError, bind_failure
from devcluster.commands import GROUP, command_entry_points, declared_in, load_commands

REPO = Path(__file__).resolve().parents[2]
EGRESS_PLACER = {"controller", "devplacer", "bench", "tests"}  # the product and what tests or measures it


def _imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, also by name through importlib.import_module or __import__."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                names.add(node.args[0].value)
    return names


def test_devcluster_imports_nothing_of_egress_placer() -> None:
    files = sorted((REPO / "devcluster").rglob("*.py"))
    assert files
    offending = {
        str(path.relative_to(REPO)): sorted(m for m in _imported_modules(path) if m.split(".")[0] in EGRESS_PLACER)
        for path in files
    }
    assert {path: modules for path, modules in offending.items() if modules} == {}


def test_the_scan_sees_every_way_of_importing(tmp_path: Path) -> None:
    source = tmp_path / "probe.py"
    source.write_text(
        "import devplacer.demo\nfrom controller.core import pools\nimport importlib\n"
        "importlib.import_module('bench.floor')\n__import__('tests.kube')\nfrom . import sibling\n"
    )
    assert _imported_modules(source) == {"devplacer.demo", "controller.core", "importlib", "bench.floor", "tests.kube"}


# The command-line contract (scripts outside the repository call these): every option of each command; every
# command also takes the version choices (issue #29).
VERSIONS = {"--tekton-version", "--kubernetes-version"}
CONTRACT = {
    "build": {"--with", *VERSIONS},
    "up": {"--dir", "--nodes", "--egress-nodes", "--pod-seconds", "--with", *VERSIONS},
    "down": {"--dir", *VERSIONS},
    "status": {"--dir", *VERSIONS},
    "kubeconfig": {"--dir", "--user", "--group", "--out", *VERSIONS},
    "controller": {"--dir", "--policy", "--pools", "--replicas", "--pool-guard", *VERSIONS},
    "demo": {"--dir", "--keep", *VERSIONS},
}


def test_the_command_line_keeps_every_command_and_option() -> None:
    commands = next(a for a in parser()._actions if a.dest == "command").choices  # noqa: SLF001
    assert list(commands) == list(CONTRACT)
    for name, options in CONTRACT.items():
        declared = {o for a in commands[name]._actions for o in a.option_strings} - {"-h", "--help"}  # noqa: SLF001
        assert declared == options, name
    args = parser().parse_args(["controller", "--dir", "d", "--policy", "p.yaml", "--pools", "--replicas", "2", "--pool-guard"])
    assert (args.dir, args.policy, args.pools, args.replicas, args.pool_guard) == (Path("d"), Path("p.yaml"), True, 2, True)
    args = parser().parse_args(["demo"])
    assert (args.dir, args.keep) == (None, False)


@pytest.mark.parametrize(("replicas", "proxy"), [(1, False), (2, True), (3, True)])
def test_controller_with_replicas_sends_admission_to_all_of_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, replicas: int, proxy: bool
) -> None:
    """More than one replica: the webhooks call the proxy in front of all of them (one per connection, as
    a Service), not replica 0 alone."""
    from devplacer import commands, local_placer

    calls: list[dict[str, object]] = []
    monkeypatch.setattr(local_placer, "start_controller", lambda cluster, policy, **kw: calls.append(kw) or [])
    args = parser().parse_args(["controller", "--dir", str(tmp_path), "--policy", "p.yaml", "--replicas", str(replicas)])
    assert commands.CONTROLLER.run(args, lambda message: None) == 0
    assert [(c["replicas"], c["proxy"]) for c in calls] == [(replicas, proxy)]


def test_controller_and_demo_come_from_egress_placers_entry_points() -> None:
    declared = declared_in(REPO / "pyproject.toml")
    assert {name: ep.value for name, ep in declared.items()} == {
        "controller": "devplacer.commands:CONTROLLER",
        "demo": "devplacer.commands:DEMO",
    }
    assert set(load_commands()) == {"controller", "demo"}


def test_installed_entry_points_are_found_without_a_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A non-editable install has no pyproject.toml beside the launcher: the metadata alone names them."""
    dist = tmp_path / "egress_placer_probe-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: egress-placer-probe\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[{GROUP}]\nprobe = json:dumps\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = command_entry_points(tmp_path / "no-pyproject.toml")
    assert found["probe"].load() is json.dumps


def test_a_command_that_does_not_load_leaves_the_others(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(f'[project.entry-points."{GROUP}"]\nbroken = "no_such_module_here:X"\nfine = "json:dumps"\n')
    commands = load_commands(pyproject)
    assert "broken" not in commands and commands["fine"] is json.dumps
    assert "command broken (no_such_module_here:X) not available: ModuleNotFoundError" in capsys.readouterr().err


def test_tools_keep_their_state_through_the_public_api(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path / "cluster", log=lambda _: None)
    with pytest.raises(ClusterError, match="no cluster"):
        cluster.record("controller", {"replicas": []})
    with cluster._locked_state() as state:  # noqa: SLF001 - what `up` writes, without a cluster
        state.update({"ports": {"kube-apiserver": 1}, "processes": []})
    assert cluster.recorded("controller") is None

    cluster.record("controller", {"replicas": [{"name": "egress-placer-0"}]})

    assert cluster.recorded("controller") == {"replicas": [{"name": "egress-placer-0"}]}
    assert cluster.state()["ports"] == {"kube-apiserver": 1}  # the launcher's own entries stay
    for key in ("ports", "processes"):
        with pytest.raises(ValueError, match="launcher's own"):
            cluster.record(key, {})
        assert cluster.recorded(key) is None


def test_devplacer_writes_no_private_state_of_the_cluster() -> None:
    private = [
        f"{path.relative_to(REPO)}:{n}"
        for path in sorted((REPO / "devplacer").rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "_locked_state" in line
    ]
    assert private == []


def test_certificates_are_made_in_two_places_only() -> None:
    """One PKI per side: the product's webhook certificates (controller/admission/certs.py) and the local
    cluster's (devcluster/certs.py: its CA, the API server's, client and loopback serving certificates);
    tests, benchmarks and devplacer use one of them, never a third."""
    makers = {
        str(path.relative_to(REPO))
        for folder in ("controller", "devcluster", "devplacer", "tests", "bench")
        for path in (REPO / folder).rglob("*.py")
        if any(word in path.read_text() for word in ("CertificateBuilder(", "generate_private_key(", "openssl"))
        and path != Path(__file__).resolve()
    }
    assert makers == {"controller/admission/certs.py", "devcluster/certs.py"}


@pytest.mark.parametrize(
    ("log", "line"),
    [
        (  # kube-apiserver, as seen in CI with another cluster on the machine
            'I1204 12:00:00.1 options.go:1] flags\nE1204 12:00:00.2 run.go:72] "command failed" err="failed to create '
            'listener: failed to listen on 127.0.0.1:41235: listen tcp 127.0.0.1:41235: bind: address already in use"\n',
            "listen tcp 127.0.0.1:41235: bind: address already in use",
        ),
        (  # etcd
            '{"level":"fatal","msg":"discovery failed","error":"listen tcp 127.0.0.1:2380: bind: address already in use"}',
            "listen tcp 127.0.0.1:2380: bind: address already in use",
        ),
        ("OSError: [Errno 98] Address already in use\n", "OSError: [Errno 98] Address already in use"),  # not Go
        ("tekton: refusing to start (test)\n", None),  # another failure: not worth fresh ports
        ("", None),
    ],
)
def test_a_taken_port_is_told_from_other_failures(log: str, line: str | None) -> None:
    assert bind_failure(log) == line
