"""The journal: intents, attempts and reconciliations, durable before anything is sent.

``_open`` opens one; ``_reads.Journal`` is what every journal offers its readers and
operators, ``_store.IntentStore`` adds the writes of payonce's own clients; ``_sqlite`` and
``_postgres`` are the backends. What they hold are the lifecycle's records
(``payonce._lifecycle._records``); ``_reports`` what the journal says about itself. The
public names are in ``payonce.journal``.
"""
