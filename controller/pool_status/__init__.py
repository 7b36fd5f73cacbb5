"""A feature: each EgressPool's status. core.py computes it (pure); reconcile.py writes it; metrics.py: pool loads."""
