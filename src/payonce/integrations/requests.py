"""A ``requests`` adapter over any httpx transport (extra ``requests``).

```python
session = requests.Session()
adapter = payonce.integrations.requests.TransportAdapter(client.transport())
session.mount("https://", adapter)
```
"""

from __future__ import annotations

from ._needs import require

require("requests", extra="requests", sdk="requests")

from .._requests_adapter import TransportAdapter  # noqa: E402

__all__ = ["TransportAdapter"]
