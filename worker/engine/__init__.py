"""The optimizer library: IR, passes, kernel tables, memory planning, plugins (no web or job imports here).

``worker.engine.api`` is its public surface: the job side and the HTTP API import nothing deeper.
"""
