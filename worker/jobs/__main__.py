"""``python -m worker.jobs``: run a worker (the same as ``mirserve worker``)."""
import sys

from worker.jobs.cli import main

sys.exit(main())
