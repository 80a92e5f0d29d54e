"""The processes: the main process, the supervisor and its workers, the admin endpoints.

The map of every package: docs/architecture.md.
"""
