"""Durable state of the daemon: sessions, turns, attempts (the TurnStore seam and its engines)."""
