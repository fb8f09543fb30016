"""mirserve's REST service (FastAPI): uploads, jobs, artifacts, trace and memory over HTTP."""
