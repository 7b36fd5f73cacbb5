"""The one way a command says it cannot do its work."""


class CommandError(Exception):
    """The message says why (no traceback); `egress-placer` prints it and exits with status 2."""
