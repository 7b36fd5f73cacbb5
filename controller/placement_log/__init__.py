"""A feature: the runs' pods placed on a pool node within the last hour (each EgressPool's status counts
them). core.py is the rule (the window, pure); view.py records them as the pod informer sees them; the
pool status reconciler (pool_status.reconcile) reads them."""
