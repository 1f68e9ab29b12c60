"""What several test modules share, one small module per concern.

Test modules import from here (``from helpers.payments import PAYMENT``), never from one
another; fixtures live in ``conftest.py``.
"""
