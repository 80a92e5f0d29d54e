"""The proxy: the front end that accepts connections, and the router that makes each
request a hit, a fill or a pass.

The map of every package: docs/architecture.md.
"""
