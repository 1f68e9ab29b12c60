"""Adyen's Python library through payonce (extra ``adyen``).

```python
adyen = Adyen.Adyen(xapikey=..., platform="test")
payonce.integrations.adyen.use_transport(adyen, client)
adyen.checkout.payments_api.payments(request, idempotency_key=...)
```

Adyen's library takes a caller's ``idempotency_key=`` and sends none otherwise; it never
retries (``Adyen/httpclient.py`` makes one ``requests.request`` per call, no session, no
retry). ``use_transport`` swaps its ``http_client`` for one that sends through
``client.transport()``, so its calls become steps of the current intent. payonce's errors
arrive as Adyen's: ``AdyenAPICommunicationError`` for a network failure or an outcome
that stays unknown (naming the key and reference), ``AdyenAPIUnprocessableEntity`` for a
key reused with another request, ``AdyenError`` for the rest; each carries the payonce error
as ``payonce_error``. A refusal by the provider (a 401 too) reaches Adyen's library as the
provider's own answer, which it raises as usual (``AdyenAPIAuthenticationError``).
"""

from __future__ import annotations

from ._needs import require

require("Adyen", extra="adyen", sdk="Adyen's Python library (Adyen)")

from ._adyen_client import TransportHTTPClient, use_transport  # noqa: E402

__all__ = ["TransportHTTPClient", "use_transport"]
