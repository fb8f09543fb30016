"""One router per resource: optimize (job creation), jobs, catalog (passes and targets), health."""
