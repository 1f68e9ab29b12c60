"""The journal: intents, attempts and reconciliations, durable before anything is sent.

Built by composition, three kinds of object on one engine. An engine per backend
(``_sqlite.SQLiteEngine`` with its group commit, ``_postgres.PostgresEngine``; the shared
part is ``_engine.Engine``) runs transactions. The public ``_reads.Journal`` holds one and
offers reads and operator commands; ``SQLiteJournal`` and ``PostgresJournal`` are journals
whose constructors make their engine, and ``_open`` opens either. The private
``_store.IntentStore`` (payonce's clients) and ``_inbox.Inbox`` (the webhook inbox) hold
the same engine and make the writes. What they hold are the lifecycle's records
(``payonce._lifecycle._records``); ``_reports`` what the journal says about itself. The
public names are in ``payonce.journal``.
"""
