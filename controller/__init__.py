"""egress-placer: places Tekton runs that need good egress onto the node pools that have it."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("egress-placer")
except PackageNotFoundError:  # run from a checkout that was never installed
    __version__ = "0+unknown"
