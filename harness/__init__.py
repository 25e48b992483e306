"""proctor: a notebook-first harness for preregistered evaluations of AI models and coding agents."""

__version__ = "0.1.0"
__all__ = ["__version__"]
