"""TPC-C (rev. 5.11) on Meridian: schema, inputs, procedures, loader, driver, consistency checks.

See docs/tpcc.md. The command is ``python bench/tpcc.py`` (``bench/tpcc.py``).
"""
