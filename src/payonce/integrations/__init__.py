"""payonce inside the provider SDKs people already use.

Each module plugs one SDK into a payonce client's transport (``client.transport()``), with
the SDK's own retries turned off (payonce retries under one key per step) and payonce's
errors raised as the exceptions that SDK's callers already catch:

- ``payonce.integrations.stripe`` — ``HTTPClient(client)`` for stripe-python (extra ``stripe``);
- ``payonce.integrations.adyen`` — ``use_transport(adyen, client)`` for Adyen's library
  (extra ``adyen``);
- ``payonce.integrations.mollie`` — ``use_transport(mollie_client, client)`` for
  mollie-api-python (extra ``mollie``);
- ``payonce.integrations.square`` — ``httpx_client(client)`` for ``square.Square``
  (extra ``square``);
- ``payonce.integrations.requests`` — ``TransportAdapter``, a ``requests`` adapter over any
  httpx transport (extra ``requests``).

Importing a module whose SDK is not installed raises ``ImportError`` naming the extra.
"""

# The integrations are its modules, each imported on its own (each needs its SDK).
__all__: list[str] = []
