"""Provider adapters: exact request bytes, parsed responses, errors as data, one httpx transport.

The manual: docs/models.md.
"""
