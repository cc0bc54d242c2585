"""Meridian's pure protocol cores: no I/O, no clocks, no randomness (DESIGN.md §7)."""
