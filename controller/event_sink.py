"""Where Kubernetes Events go: the one `EventSink` protocol every part that reports uses.

The kube adapter's `EventRecorder` implements it (a queue and a writer thread), admission's
`QuietEvents` holds Events back while admission is busy; tests pass a list. Pure typing: any layer
may import it.
"""

from __future__ import annotations

from typing import Any, Protocol


class EventSink(Protocol):
    """Never blocks, never raises: an implementation queues the Event and writes it later."""

    def emit(self, regarding: dict[str, Any], type: str, reason: str, note: str, action: str = "") -> None: ...
