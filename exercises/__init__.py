"""Your code for the graded exercises, one module per chapter."""
