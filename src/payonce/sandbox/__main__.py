"""``python -m payonce.sandbox``: ``payonce sandbox``, the same command and options."""

from __future__ import annotations

from collections.abc import Sequence

from payonce.cli import cli


def main(argv: Sequence[str] | None = None) -> None:
    """Run the sandbox provider until SIGINT/SIGTERM; exits with the command's status."""
    command = cli.commands["sandbox"]
    command.main(args=argv, prog_name="python -m payonce.sandbox")


if __name__ == "__main__":
    main()
