"""Metering: what every provider exchange cost, from the wire rather than anyone's say-so.

The manual: docs/models.md.
"""
