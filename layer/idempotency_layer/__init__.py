"""Exactly-once execution for unmodified AWS Lambda Python handlers, driven by environment variables."""

__version__ = "0.1.0"
