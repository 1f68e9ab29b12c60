"""Square's Python SDK (squareup) through payonce (extra ``square``).

```python
square = Square(token=..., httpx_client=payonce.integrations.square.httpx_client(client))
```

Square takes the key in the JSON body (``idempotency_key``, required on create calls) and
the SDK retries 408, 409, 429 and 5xx itself (``core/http_client.py``: ``max_retries`` 2 per
call, under the same body, so the same key). ``httpx_client(client)`` gives Square an
``httpx.Client`` over ``client.transport()``; pass ``request_options={"max_retries": 0}``
on calls to leave retrying to payonce. The key a caller puts in the body is kept (Square's
callers choose it). A payonce error arrives as Square's ``ApiError`` (``status_code``
None, one error of category ``API_ERROR`` and code ``PAYONCE_<ERROR>``, the detail naming
the key and reference).
"""

from __future__ import annotations

from ._needs import require

require("square", extra="square", sdk="Square's Python SDK (squareup)")

from ._square_glue import async_httpx_client, httpx_client  # noqa: E402

__all__ = ["async_httpx_client", "httpx_client"]
