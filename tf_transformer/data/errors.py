"""The one error type for bad data input: it says what, where and what to do."""


class DataError(ValueError):
  """Bad input data or data flags; the message names the file and line or
  the flag, and how to fix it."""
