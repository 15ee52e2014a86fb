"""Helpers of the fault tests (tests/system/test_faults.py): load generators, a private stack, the report."""
