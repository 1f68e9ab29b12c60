"""``python -m payonce``: the ``payonce`` command, where the console script is not on PATH."""

from payonce.cli import main

main()
