"""The embedded SQLite engine of the turn store."""
