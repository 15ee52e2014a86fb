"""Helpers of the fault tests (tests/integration/test_faults.py): load generators, a private stack, the report."""
