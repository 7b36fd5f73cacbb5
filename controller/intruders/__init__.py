"""A feature: pods that may not be on pool nodes. core.py finds them (pure); reconcile.py removes or reports them."""
