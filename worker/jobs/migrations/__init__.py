"""The job tables' schema history (Alembic): ``versions/`` holds one revision per change, oldest first.

``worker.jobs.schema`` runs them (``mirserve db upgrade``); ``env.py`` is what Alembic executes for each run.
"""
