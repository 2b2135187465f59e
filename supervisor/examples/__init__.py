# Example executors built on the SDK: web_executor (a working one against a local HTTP page
# server) and chaos_executor (misbehaves on purpose). Each runs as
# `python -m supervisor.examples.<name> --socket PATH ...`.
