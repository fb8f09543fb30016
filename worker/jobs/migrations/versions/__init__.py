"""One module per revision of the job tables, named after its revision id."""
