"""Runnable examples: `python -m modopt.examples.digits`."""
