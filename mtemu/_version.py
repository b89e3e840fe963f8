"""The package version, alone so that light modules (``mtemu.version``) can import it."""
__version__ = "0.1.0"
