"""A feature: runs created while no webhook was called. view.py finds them; reconcile.py reports them."""
