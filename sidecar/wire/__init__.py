"""The wire: HTTP/1.1 and TLS as RFC 9110 and 9112 define them, server and client; nothing
about caching.

The map of every package: docs/architecture.md.
"""
