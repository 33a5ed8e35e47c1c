"""The one error type for bad data input: it says what, where and what to do.

Corpora are read inside code that wraps exceptions in its own: a `DataError`
raised in a `tf.data.Dataset.from_generator` generator comes out of the
iterator as an `InvalidArgumentError` carrying a traceback, and one raised in
SentencePiece's sentence iterator as the trainer's `RuntimeError`. Readers
wrapped by `remembered` note each `DataError` they raise; code that consumes
them runs under `unwrapped`, which turns such a foreign error back into the
`DataError` itself, so a user reads one sentence naming the file and line.
"""

import contextlib
from typing import Iterable, Iterator


class DataError(ValueError):
  """Bad input data or data flags; the message names the file and line or
  the flag, and how to fix it."""


_raised = []  # DataErrors raised by `remembered` readers, newest last


def remembered(pairs: Iterable) -> Iterator:
  """Yields from `pairs`, noting a `DataError` before it propagates."""
  try:
    yield from pairs
  except DataError as e:
    _raised.append(e)
    raise


@contextlib.contextmanager
def unwrapped():
  """Re-raises the `DataError` behind any other error that a reader's
  `DataError` turned into while this block ran (usable as a decorator)."""
  start = len(_raised)
  try:
    yield
  except DataError:
    raise
  except Exception:  # pylint: disable=broad-except
    if len(_raised) > start:
      raise _raised[-1] from None
    raise
  finally:
    del _raised[start:]
