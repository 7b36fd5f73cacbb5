"""The exit statuses of `egress-placer`, and the one way a command says it cannot do its work.

| status | meaning |
|---|---|
| 0 | done; nothing wrong found |
| 1 | done, and something is wrong in the cluster: drift or findings (`status`: a wrong taint, an intruder, a missing node agent) |
| 2 | usage or configuration: bad arguments, invalid settings, no usable kubeconfig, an invalid or missing policy, unreadable input files |
| 3 | the cluster cannot be reached or read: no answer from the API server (refused, timeout, TLS, name), or a request it refused |
| 4 | internal error: a bug in egress-placer (the message names the exception) |

README.md ("Command line") shows the same table; tests/unit/test_cli_exit_codes.py checks it.
"""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    OK = 0
    FINDINGS = 1
    USAGE = 2
    UNREACHABLE = 3
    INTERNAL = 4


class CommandError(Exception):
    """The message says why (no traceback); `egress-placer` prints it in one line on stderr and exits
    with `status` (2, usage or configuration, unless said otherwise)."""

    def __init__(self, message: str, status: Exit = Exit.USAGE) -> None:
        super().__init__(message)
        self.status = status


class ClusterUnreachable(CommandError):
    """The cluster cannot be reached or read: exit status 3."""

    def __init__(self, message: str) -> None:
        super().__init__(message, Exit.UNREACHABLE)
