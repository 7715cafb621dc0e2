"""Event sources: each module turns one family of events into units of work for the cycle and shapes the
response. The cycle stays the same for all of them; the interceptor only picks the module."""
