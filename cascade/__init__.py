"""cascade: a Laya-first cascading router for typed decisions."""

__version__ = "0.1.0"
__all__ = ["__version__"]
