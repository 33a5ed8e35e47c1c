"""Progress lines of long work: rewritten in place on a terminal, a log
line every few seconds elsewhere, nothing for quick work."""

import io

from absl import logging

from tf_transformer.progress import Progress


class FakeClock:
  def __init__(self):
    self.now = 100.0

  def __call__(self):
    return self.now


class Terminal(io.StringIO):
  def isatty(self):
    return True


def test_quick_work_shows_nothing(caplog):
  clock, stream = FakeClock(), Terminal()
  with Progress("translated", 10, "sentences", clock=clock,
                stream=stream) as progress:
    clock.now += 0.5
    progress.add(10)
  assert stream.getvalue() == "" and not caplog.records


def test_a_terminal_gets_one_line_rewritten_in_place():
  clock, stream = FakeClock(), Terminal()
  with Progress("translated", 1000, "sentences", clock=clock,
                stream=stream) as progress:
    for _ in range(4):
      clock.now += 2.0
      progress.add(100)
  lines = stream.getvalue().split("\r")[1:]
  assert len(lines) == 5  # 4 updates and the final line
  assert lines[0] == ("translated 100/1,000 sentences (10%), 50.0 "
                      "sentences/s, ETA 0:00:18\033[K")
  assert lines[-1].startswith("translated 400/1,000 sentences (40%)")
  assert stream.getvalue().endswith("\n")


def test_a_log_gets_a_line_every_period(caplog):
  caplog.set_level(logging.INFO)
  clock = FakeClock()
  progress = Progress("tokenized train:", None, "pairs", every_secs=10,
                      clock=clock, stream=io.StringIO())
  for _ in range(25):
    clock.now += 1.0
    progress.add(4096)
  progress.close()
  messages = [r.getMessage() for r in caplog.records]
  assert messages == [
      "tokenized train: 40,960 pairs, 4,096.0 pairs/s, 0:00:10",
      "tokenized train: 81,920 pairs, 4,096.0 pairs/s, 0:00:20",
      "tokenized train: 102,400 pairs, 4,096.0 pairs/s, 0:00:25"]
