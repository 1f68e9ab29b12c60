"""Provider profiles: what differs between payment providers' idempotency contracts.

``_profile`` holds ``ProviderProfile`` and the registry; each provider has a module of its
own. Importing this package registers the built-in profiles by name; the public names are
in ``payonce.providers``.
"""

from ._adyen import ADYEN
from ._mollie import MOLLIE
from ._profile import register_profile
from ._square import SQUARE
from ._stripe import STRIPE

for _builtin in (STRIPE, ADYEN, MOLLIE, SQUARE):
    register_profile(_builtin)
del _builtin
