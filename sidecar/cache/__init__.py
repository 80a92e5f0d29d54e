"""Cache rules: RFC 9111 as a private cache applies it, pure functions of strings and
numbers.

The map of every package: docs/architecture.md.
"""
