"""The job machinery: the job table, the queue, the runner that supervises the engine, and the reaper.

The job table is the source of truth; the queue (huey) only carries "job X may be ready" wake-ups and may
lose them (huey delivers at most once), which the reaper repairs. Nothing here imports the web layer.
"""
