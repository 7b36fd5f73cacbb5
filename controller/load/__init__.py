"""A feature: load and assumptions. core.py and index.py are pure; view.py keeps the load picture."""
