"""The base class of every expected failure. Messages name the file, field, value or location
that is wrong; the CLIs print them on one line and exit 2."""


class UserError(ValueError):
    """Bad input, a bad platform, or a program the machine refuses (not a bug in this package)."""
