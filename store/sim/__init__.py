"""Deterministic simulation: whole clusters in one thread on virtual time (DESIGN.md §8)."""
