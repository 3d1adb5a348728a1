"""Integrations with other projects' test suites."""
