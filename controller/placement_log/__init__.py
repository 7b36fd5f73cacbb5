"""A feature: the runs' pods placed on a pool node within the last hour (each EgressPool's status counts
them). view.py records them as the pod informer sees them; the pool status reconciler
(reconcile.pool_status) reads them; the rule that counts them is core.pool_status."""
