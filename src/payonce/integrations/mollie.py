"""mollie-api-python through payonce (extra ``mollie``).

```python
mollie_client = mollie.api.client.Client()
mollie_client.set_api_key("live_…")
payonce.integrations.mollie.use_transport(mollie_client, client)
```

mollie-api-python gives every ``create``/``update``/``delete`` a fresh ``uuid4`` key
(``resources/base.py``: ``idempotency_key or self._generate_idempotency_key()``), and its
requests session retries failed *connects* only (``Retry(connect=3, read=0)``, mounted on
``https://``); a network failure raises ``RequestError`` without the key. ``use_transport``
mounts a ``TransportAdapter`` over ``client.transport()`` on the SDK's session (for both
schemes, replacing its retrying adapter), so payonce's key per step replaces the random
one; a key the caller passes as ``idempotency_key=`` is kept as the step's. A payonce
error arrives as Mollie's ``RequestError`` ("Unable to communicate with Mollie: …",
naming the key and reference); mollie-api-python raises it
while handling the ``requests`` error that carries the payonce error as ``payonce_error``,
so it is ``error.__context__.payonce_error``.
"""

from __future__ import annotations

from ._needs import require

require("mollie.api.client", extra="mollie", sdk="mollie-api-python")
require("requests", extra="mollie", sdk="requests")

from ._mollie_glue import use_transport  # noqa: E402

__all__ = ["use_transport"]
