"""A feature: node agents (DaemonSets) on pool nodes. core.py: which tolerations they need (pure); reconcile.py."""
