"""The pure decision core: plain data in, decisions with reasons out.

Nothing here imports the Kubernetes client, does I/O, or reads a clock it was not given.
"""
