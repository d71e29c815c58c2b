"""A tiny package the parallel-edits campaign adds two modules to."""
