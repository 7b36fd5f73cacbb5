"""A feature: the pools' taints. core.py plans them (pure); reconcile.py writes them on the nodes."""
