"""The admission handler's hot path does no work it does not need: each decision's debug line is built
only when the log level lets it out (no per-review `logger.bind` otherwise), and the pure steps it
repeats for every review (image discovery, `decide`, the placed template) are memoised, keyed on
everything they read, in bounded memos (controller/admission/memo.py): a changed input gives a new answer."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from loguru import logger

import controller.admission.handlers as handlers_module
from tests.unit.test_admission_handlers import Env, decision_of, taskrun, tekton_pod


@pytest.mark.parametrize(("level", "lines"), [("INFO", 0), ("DEBUG", 2)])
def test_a_decisions_debug_line_only_at_debug_level(level: str, lines: int, monkeypatch: pytest.MonkeyPatch) -> None:
    env = Env(log_level=level)
    bound: list[dict[str, Any]] = []
    real_bind = logger.bind

    def bind(**extra: Any) -> Any:
        bound.append(extra)
        return real_bind(**extra)

    monkeypatch.setattr(handlers_module.logger, "bind", bind)
    seen: list[str] = []
    sink = logger.add(lambda message: seen.append(message.record["message"]), level="DEBUG")
    try:
        env.review(taskrun())
        env.review(tekton_pod())
    finally:
        logger.remove(sink)
    assert len(bound) == lines and len([m for m in seen if m.startswith("image-match")]) == lines
