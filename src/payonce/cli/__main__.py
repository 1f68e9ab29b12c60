"""``python -m payonce.cli``: the ``payonce`` command."""

from payonce.cli import main

main()
