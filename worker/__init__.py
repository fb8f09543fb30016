"""mirserve: the optimizer library (``worker.engine``) and the job process that runs it (``worker.jobs``)."""
__version__ = "0.1.0"
