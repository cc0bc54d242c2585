"""Deterministic simulation: whole clusters in one thread on virtual time (DESIGN.md §8)."""

# The scripted fault schedules of ``meridian sim --scenario`` (``store.sim.run.SCENARIOS``
# holds them; named here so the command line needs no simulator import to list them).
SCENARIO_NAMES = ("rejoin-behind", "majority-crash", "far-behind", "whole-cluster")
