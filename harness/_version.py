"""The version of proctor, in a module of its own so that any layer may read it.

The manual: docs/layout.md.
"""

__version__ = "0.1.0"
