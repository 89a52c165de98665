"""Worked solutions, with the same signatures as exercises/."""
