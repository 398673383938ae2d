"""Settings read from environment variables, checked: a bad value names the variable and its valid range.

Workers read some of their settings from the environment (a deadline,
a poll interval, a thread's priority), because they start before any
Python call could pass them. :func:`env_number` reads one such number.

Examples
--------
>>> env_number("HPCGPU_EXAMPLE_UNSET", 5, int, lambda v: 0 <= v <= 9, "an int from 0 to 9")
5
"""

import os

from hpcgpu.errors import ConfigError

__all__ = ["env_number"]


def env_number(name, default, kind, valid, valid_words):
    """The number in the environment variable ``name``, or ``default`` when it is not set.

    Parameters
    ----------
    name : str
        The variable.
    default : int or float
        Its value when unset.
    kind : {int, float}
        How its text is read.
    valid : callable
        True for an accepted value (NaN fails every range test).
    valid_words : str
        What is accepted, for the error: "``name`` must be <valid_words>; got '<text>'".

    Raises
    ------
    ConfigError
        The text is no ``kind`` or ``valid`` rejects it.
    """
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not valid(value):
        raise ConfigError(f"{name} must be {valid_words}; got {text!r}")
    return value
