"""The journal: intents, attempts and reconciliations, durable before anything is sent.

``_open`` opens one; ``_reads.Journal`` is what every journal offers its readers and
operators, ``_store.IntentStore`` adds the writes of payonce's own clients; ``_sqlite`` and
``_postgres`` are the backends; ``_records`` what they hold. The public names are in
``payonce.journal``.
"""
