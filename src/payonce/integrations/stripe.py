"""stripe-python through payonce (extra ``stripe``).

```python
http_client = payonce.integrations.stripe.HTTPClient(client)
stripe_client = stripe.StripeClient(api_key, http_client=http_client)
```

stripe-python gives every POST a random ``Idempotency-Key`` of its own (``_api_requestor.py``:
``headers.setdefault("Idempotency-Key", _generate_idempotency_key())``) and retries under it
within one call only; a restarted process sends the same business operation under a new key.
So this client replaces the keys stripe-python drew itself with payonce's key per step (a key
the caller passed, ``idempotency_key=``, is kept: it is the step's) and turns stripe-python's
own retries off: payonce
already retried under its key, honouring ``Stripe-Should-Retry`` (the stripe profile's
retry hint), and a second attempt made by the SDK would be a new step of the intent.

payonce's errors arrive as the stripe errors callers catch: an outcome that stays unknown is
``stripe.APIConnectionError`` with ``should_retry=False``, naming the key and the reference;
each carries the payonce error as ``payonce_error`` (and as its ``__cause__``), and its key,
reference and step as ``payonce_key``, ``payonce_reference`` and ``payonce_step``. A
programming error (two steps of one block at once, a request outside the client's
``base_url``) is payonce's ``ConfigurationError`` itself, never a connection error to retry.
"""

from __future__ import annotations

from ._needs import require

require("stripe", extra="stripe", sdk="stripe-python")

from ._stripe_client import HTTPClient  # noqa: E402

__all__ = ["HTTPClient"]
