"""Progress of long work (translating a file, exporting, preparing a corpus)
on stderr, for the bin/ commands.

On a terminal, one line rewritten in place once the work has run a second;
elsewhere (a log file, a pipe, bin/main_job.py) an absl log line every
`every_secs`, where rewritten lines would pile up. Work that ends before
either shows nothing. keras.utils.Progbar draws a bar, but on stdout, where
bin/translate.py writes its translations.
"""

import sys
import time

from absl import logging


def _clock(seconds):
  seconds = int(seconds)
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
  """`add(n)` as items are done, `close()` at the end (or use `with`)."""

  def __init__(self, verb, total, unit, every_secs=10.0, stream=None,
               clock=time.monotonic):
    self.verb, self.total, self.unit = verb, total, unit
    self.every_secs, self.clock = every_secs, clock
    self.stream = stream or sys.stderr
    self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
    self.done, self.shown = 0, False
    self.start = self.last_shown = clock()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  def line(self):
    elapsed = max(self.clock() - self.start, 1e-9)
    rate = self.done / elapsed
    text = f"{self.verb} {self.done:,}"
    if self.total:
      text += f"/{self.total:,} {self.unit} ({100 * self.done // self.total}%)"
    else:
      text += f" {self.unit}"
    text += f", {rate:,.1f} {self.unit}/s"
    if self.total and rate > 0 and self.done < self.total:
      text += f", ETA {_clock((self.total - self.done) / rate)}"
    else:
      text += f", {_clock(elapsed)}"
    return text

  def add(self, n=1):
    self.done += n
    now = self.clock()
    due = self.every_secs if not self.tty else (1.0 if not self.shown else
                                                 0.2)
    if now - self.last_shown >= due:
      self._show()
      self.last_shown = now

  def _show(self):
    self.shown = True
    if self.tty:
      self.stream.write("\r" + self.line() + "\033[K")
      self.stream.flush()
    else:
      logging.info("%s", self.line())

  def close(self):
    """The final line, if any line was shown."""
    if self.shown:
      self._show()
      if self.tty:
        self.stream.write("\n")
        self.stream.flush()
