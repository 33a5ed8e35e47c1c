"""Stopping on SIGTERM (a cluster's preemption) or Ctrl-C without losing work.

`StopRequest.install()` replaces the default handlers: the first SIGTERM or
SIGINT only records the request, and the training loop, which checks it after
every step, saves a checkpoint at that step boundary and returns; the script
then exits with 128 + the signal number (143 for SIGTERM, 130 for SIGINT),
the status shells give a process ended by that signal, so a scheduler sees
"stopped, restart me" and never "finished", within about a second of the
signal (`command.exit_now`). A second Ctrl-C stops at once, without
saving.

TensorFlow's `PreemptionCheckpointHandler` does this for SIGTERM alone, with
its own checkpoint and exit; here Ctrl-C gets the same treatment and the
save goes through the run's `Checkpointer` (same names, same finiteness
check). Under MultiWorkerMirroredStrategy the workers agree on stopping with
one scalar all-reduce per step (`Trainer`), so a signal to any one of them
makes all save the same step.
"""

import signal

from absl import logging

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequest:
  """Records the first SIGTERM or SIGINT once `install`ed."""

  def __init__(self):
    self.signal = None

  def install(self) -> "StopRequest":
    for signum in SIGNALS:
      signal.signal(signum, self._handle)
    return self

  def _handle(self, signum, frame):
    del frame
    if self.signal is not None and signum == signal.SIGINT:
      raise KeyboardInterrupt  # the second Ctrl-C: stop now
    if self.signal is None:
      self.signal = signum
      logging.warning("%s received: stopping after this step with a "
                      "checkpoint (Ctrl-C again to stop at once, unsaved)",
                      self.signal_name)

  @property
  def requested(self) -> bool:
    return self.signal is not None

  @property
  def signal_name(self) -> str:
    return signal.Signals(self.signal).name if self.signal else ""

  @property
  def exit_status(self) -> int:
    return 128 + int(self.signal) if self.signal else 0
