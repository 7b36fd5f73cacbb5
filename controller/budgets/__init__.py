"""A feature: egress budgets (docs/budgets.md). core.py is pure: what a run touches, counts, room, the verdict."""
