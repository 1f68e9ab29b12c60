"""The frozen records payonce hands back: about a response (``ResponseInfo``), a retry
(``RetryEvent``, for ``on_retry`` hooks), and each intent of a ``resume`` or a
``reconcile`` pass (``ReconcileOutcome``: what each look-up came to). The journal's own
records are in ``payonce.journal``."""

from ._lifecycle import ReconcileOutcome
from ._runtime._batch import ResumeResult
from ._runtime._events import RetryEvent
from ._runtime._reconcile import ReconcileResult
from ._runtime._responses import ResponseInfo

__all__ = ["ReconcileOutcome", "ReconcileResult", "ResponseInfo", "ResumeResult", "RetryEvent"]
