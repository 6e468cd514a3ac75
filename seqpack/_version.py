"""seqpack's version, in a leaf module (importable without the package's face)."""

__version__ = "0.1.0"
