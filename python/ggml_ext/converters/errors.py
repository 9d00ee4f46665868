"""The one error type of the converter: what is wrong, said so a user can act on it."""
from __future__ import annotations


class ConversionError(ValueError):
    """The input cannot be converted (missing or malformed files, unsupported model, bad weights).

    The message names the file or tensor at fault; no output file is left behind.
    """
