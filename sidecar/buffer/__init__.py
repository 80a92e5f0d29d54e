"""The burst buffer: stored objects and their index, its one writer, fills shared by every
worker.

The map of every package: docs/architecture.md.
"""
