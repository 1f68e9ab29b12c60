"""The I/O edges: the clients (sync and async), the lease keeper, the batch runner.

Every decision is made in ``payonce._lifecycle``; ``_core`` drives those decisions for one
intent through the journal, and the clients only send bytes, sleep and wait around it.
"""
