"""The demo: a daemon, example executors and a mixed batch of turns with expected outcomes."""
