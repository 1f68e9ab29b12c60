"""The private parts of the ``payonce`` command: formatting and plumbing for ``payonce.cli``.

Like the command itself, they use only the public ``payonce`` API.
"""
