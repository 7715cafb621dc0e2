"""Fixtures of the DynamoDB client's unit tests: a clean AWS environment, a scripted DynamoDB on loopback, and a
CA of our own (tests/support/scripted_dynamodb.py)."""

from tests.support.scripted_dynamodb import aws_env, own_ca, scripted  # noqa: F401 - fixtures, by name
