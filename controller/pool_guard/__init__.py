"""A feature: the pool guard (a ValidatingAdmissionPolicy). core.py makes it (pure); reconcile.py keeps its params."""
