"""egress-placer: places Tekton runs that need good egress onto the node pools that have it."""
