"""Fuzzing the policy loader (`load_policy`): whatever the text (random text, the example policy with
lines dropped, duplicated or garbled, random YAML documents shaped like a policy), it returns a
PlacementPolicy or raises PolicyError, never another exception, and every line of a PolicyError's
message names the source and a line number (except "the policy is empty", which has no line to
name). A table of known-nasty YAML (control characters, non-scalar keys, recursive and exponential
aliases, deep nesting, huge integers, tags) must be refused that way; a byte order mark is read past."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from controller.core.policy import PlacementPolicy, PolicyError, load_policy

EXAMPLE = (Path(__file__).parents[2] / "config" / "policy.example.yaml").read_text()
EXAMPLE_LINES = EXAMPLE.splitlines(keepends=True)
HEADER = "apiVersion: egress-placer.io/v1alpha1\nkind: PlacementPolicy\n"
NAMES_A_LINE = re.compile(r"^<fuzz>:\d+: \S")
EMPTY = "<fuzz>: the policy is empty; expected a PlacementPolicy mapping"  # no line to name
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check(text: str) -> None:
    """The property: a policy, or a PolicyError whose every line is `<fuzz>:LINE: what`."""
    try:
        policy = load_policy(text, "<fuzz>")
    except PolicyError as error:
        lines = str(error).splitlines()
        assert lines, "an empty PolicyError message"
        unnamed = [line for line in lines if not NAMES_A_LINE.match(line) and line != EMPTY]
        assert not unnamed, unnamed
        return
    assert isinstance(policy, PlacementPolicy)


def check_refused(text: str) -> None:
    """Refused: a PolicyError whose every line is `<fuzz>:LINE: what` (not a policy, not another error)."""
    with pytest.raises(PolicyError) as refused:
        load_policy(text, "<fuzz>")
    lines = str(refused.value).splitlines()
    assert lines, "an empty PolicyError message"
    unnamed = [line for line in lines if not NAMES_A_LINE.match(line) and line != EMPTY]
    assert not unnamed, unnamed


def laughs(levels: int) -> str:
    """The "billion laughs": each level nine aliases of the one before (9**levels leaves)."""
    out = [HEADER, "l0: &l0 [ha, ha, ha, ha, ha, ha, ha, ha, ha]\n"]
    for i in range(1, levels + 1):
        out.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n")
    out.append(f"pools: *l{levels}\n")
    return "".join(out)


NASTY = {
    "empty": "",
    "only a comment": "# nothing here\n",
    "a bell character": HEADER + "pools: []\x07\n",
    "a NUL character": HEADER + "pools:\n  - name: a\x00b\n",
    "a lone surrogate": HEADER + "pools: ['\ud800']\n",
    "a list as a key": HEADER + "? [a, b]\n: c\n",
    "a mapping as a key in a pool": HEADER + "pools:\n  - {[a]: b}\n",
    "a recursive list": HEADER + "pools: &a [*a]\n",
    "a recursive mapping": HEADER + "pools:\n  - &p {name: x, nodes: [n], extra: *p}\n",
    "nested 3000 deep": HEADER + "pools: " + "[" * 3000 + "]" * 3000 + "\n",
    "a mapping nested 3000 deep": HEADER + "pools: " + "{a: " * 3000 + "b" + "}" * 3000 + "\n",
    "9**8 laughs": laughs(8),
    "an integer of 5000 digits": HEADER + "pools:\n  - name: a\n    nodes: [n]\n    capacity: " + "9" * 5000 + "\n",
    "a python tag": HEADER + "pools: !!python/object/apply:os.system [true]\n",
    "two documents": HEADER + "---\n" + HEADER,
    "a scalar": "just text",
    "tabs": HEADER + "pools:\n\t- name: a\n",
    "a duplicate key deep down": HEADER + "pools:\n  - name: a\n    nodes: [n]\n    name: b\n",
    "a timestamp as a name": HEADER + "pools:\n  - name: 2020-01-01\n    nodes: [n]\n",
    "NaN capacity": HEADER + "pools:\n  - name: a\n    nodes: [n]\n    capacity: .nan\n",
    "a binary value": HEADER + "pools: !!binary aGVsbG8=\n",
    "merge keys": HEADER + "base: &b {name: x}\npools:\n  - <<: *b\n    nodes: [n]\n",
}


@pytest.mark.parametrize("text", NASTY.values(), ids=NASTY.keys())
def test_nasty_yaml_is_refused_with_a_line(text: str) -> None:
    check_refused(text)


def test_a_byte_order_mark_before_a_valid_policy_is_read_past() -> None:
    policy = load_policy("\ufeff" + HEADER + "pools:\n  - name: overseas\n    nodes: [egress-1]\n", "<fuzz>")
    assert [p.name for p in policy.pools] == ["overseas"]


@FUZZ
@given(st.text())
def test_any_text(text: str) -> None:
    check(text)


@st.composite
def garbled_example(draw: st.DrawFn) -> str:
    """The example policy with a few lines dropped, duplicated, swapped or with characters changed."""
    lines = list(EXAMPLE_LINES)
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(lines) - 1))
        edit = draw(st.sampled_from(["drop", "duplicate", "swap", "garble", "truncate", "indent"]))
        if edit == "drop":
            del lines[i]
        elif edit == "duplicate":
            lines.insert(i, lines[i])
        elif edit == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif edit == "garble":
            at = draw(st.integers(0, max(0, len(lines[i]) - 1)))
            lines[i] = lines[i][:at] + draw(st.text(min_size=1, max_size=3)) + lines[i][at + 1 :]
        elif edit == "truncate":
            lines = lines[: i + 1]
            lines[-1] = lines[-1][: draw(st.integers(0, len(lines[-1])))]
        else:
            lines[i] = " " * draw(st.integers(1, 3)) + lines[i]
        if not lines:
            break
    return "".join(lines)


@FUZZ
@given(garbled_example())
def test_the_example_policy_garbled(text: str) -> None:
    check(text)


SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=30),
    st.sampled_from(["overseas", "egress-placer.io/pool", "*/cdn-*", "required", "In", "NoSchedule", ""]),
)
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=20)
POOL_FIELDS = ["name", "nodeSelector", "nodes", "images", "namespaces", "namespaceSelector", "placement", "capacity", "taint", "egressLoad"]


@st.composite
def policy_shaped(draw: st.DrawFn) -> str:
    """A YAML document with the policy's field names and random values of random types."""
    pools = draw(st.lists(st.dictionaries(st.sampled_from(POOL_FIELDS), VALUES, max_size=6), max_size=3))
    doc = {"apiVersion": draw(st.sampled_from(["egress-placer.io/v1alpha1", "v1", 1])), "kind": "PlacementPolicy", "pools": pools}
    if draw(st.booleans()):
        doc["exemptNamespaces"] = draw(VALUES)
    return yaml.safe_dump(doc, allow_unicode=draw(st.booleans()))


@FUZZ
@given(policy_shaped())
@example(HEADER + "pools:\n  - name: overseas\n    nodes: [egress-1]\n    capacity: 0\n")
def test_policy_shaped_documents(text: str) -> None:
    check(text)
