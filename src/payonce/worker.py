"""The recovery worker behind ``payonce worker``, for a process of your own.

    from payonce.worker import Worker
    with Worker(journal="postgresql://...", base_url="https://api.stripe.com") as worker:
        worker.run(interval=5.0)        # until worker.stop(), e.g. from a SIGTERM handler

Each pass reconciles the unknown intents their provider profile's ``ReconcileSchedule``
says are due, escalates those whose schedule is spent (an ERROR log,
``Hooks.escalated``), and sends the pending intents no live worker holds, for every
provider and account in the journal. docs/deploying.md shows it deployed.
"""

from ._runtime._events import WorkerPassEnded
from ._runtime._worker import Worker

__all__ = ["Worker", "WorkerPassEnded"]
