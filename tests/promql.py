"""The series a PromQL expression reads, for the tests that hold the shipped alerts and dashboard to the
metrics contract (tests/unit/test_metrics.py, CONTRACT).

Not a PromQL parser: strings, label matchers, range and subquery brackets and the label lists of
by/without/on/ignoring/group_left/group_right are cut out, then every identifier that is neither a
keyword nor called like a function (`name(`) is a series name. Grafana's `label_values(SERIES, label)`
and its `$variables` are understood. tests/unit/test_alerts.py holds it to a table of expressions.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

KEYWORDS = frozenset({
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "inf", "nan",
    # aggregation operators may stand before `by (...)`, away from their parenthesis
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk", "quantile",
    "limitk", "limit_ratio",
})
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def series_names(expr: str) -> set[str]:
    """The names of the series `expr` selects."""
    text = re.sub(r"\blabel_values\s*\(\s*([a-zA-Z_:][\w:]*)\s*(?:\{[^}]*\})?\s*,\s*\w+\s*\)", r"\1", expr)  # Grafana's
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', text)
    text = re.sub(r"\$\{[^}]*\}|\$\w+", "1", text)
    text = re.sub(r"\{[^{}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", text)
    names = re.findall(r"(?<![\w.:])([a-zA-Z_:][\w:]*)(?![\w:])(?!\s*\()", text)
    return {n for n in names if n.lower() not in KEYWORDS}


def unknown_series(expr: str, contract: Mapping[str, tuple[str, tuple[str, ...]]]) -> set[str]:
    """Names `expr` reads that are no series of `contract` (a histogram's _bucket, _sum and _count are its own)."""
    def known(name: str) -> bool:
        if name in contract:
            return True
        return any(name.endswith(s) and contract.get(name.removesuffix(s), ("",))[0] == "histogram" for s in HISTOGRAM_SUFFIXES)

    return {n for n in series_names(expr) if not known(n)}
