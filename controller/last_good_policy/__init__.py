"""A feature: the last good policy, stored so that a restart with a broken policy keeps it (reconcile.py)."""
