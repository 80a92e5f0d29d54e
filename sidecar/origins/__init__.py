"""Origins: how a request reaches an origin (routes, an upstream proxy, parent caches,
names).

The map of every package: docs/architecture.md.
"""
