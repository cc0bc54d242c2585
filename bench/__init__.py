"""Benchmarks run against Meridian as a user would: TPC-C (``bench/tpcc``)."""
