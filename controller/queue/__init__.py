"""A feature: the queue. core.py is pure; view.py reads it from the stores; reconcile.py releases runs."""
