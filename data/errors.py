"""The one exception the data package raises for user errors."""


class DataError(ValueError):
    """A problem with the data configuration or corpus.

    The message is one line: what is wrong, then what to do about it, e.g.
    "data.source: no such file or directory '/x/y': point data.source at a text file, ...".
    """
