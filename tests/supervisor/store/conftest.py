"""The store tests.

The conformance suite tests what every engine guarantees of `TurnStore.recover` (a daemon
takes back what it held, and turns nobody holds); what only one engine does is tested with that
engine (the embedded one takes every unfinished turn, whoever held it, in
``test_sqlite_engine.py``; the shared one leaves another daemon's live claims alone, in
``test_postgres_engine.py``).

The cluster fixtures (`pg_cluster`, `pg_dsn`, `own_pg_cluster`) are in
`tests/supervisor/conftest.py`.
"""
