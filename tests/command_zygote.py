"""Runs bin/ and benchmarks/ commands for the tests in forks of one process
that has imported TensorFlow once, instead of a fresh interpreter each.

Every command run as a user runs it pays TensorFlow's import (4-6 s on 2
cores) before its own work; the suite runs commands a few hundred times.
`Zygote` starts one process per test worker that imports TensorFlow,
tensorflow-text, Keras and the package's modules, then forks a child per
command: the child runs the script as `python SCRIPT ARGS` would (its own
`__main__`, flags and stdin, stdout and stderr at the file-descriptor
level), with what the import left in place. It never runs an op before it
forks, so no thread pool exists to be lost in the child.

What a fork cannot show, tests run in a fresh interpreter (`run_script`'s
`fresh=True`, or any `env=`): what the command prints while TensorFlow
loads, and environment variables read at import (TF_ENABLE_ONEDNN_OPTS,
TF_CPP_MIN_LOG_LEVEL).
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

# The zygote: imports, then serves one request a line on stdin (JSON), with
# JSON lines on stdout. A command (argv, cwd, stdin, stdout, stderr paths, an
# environment or none): {"pid"}, then, unless "background", {"status"} once
# it ends. {"poll": PID}: {"status"} of a background command, null while it
# runs. At the end of its input (the test process left), background commands
# still running (those a failed test left) are killed.
_SERVE = r"""
import gc, json, os, runpy, sys
import tf_transformer  # first, as a command imports it: it sets TF's options
import tensorflow, tensorflow_text, keras  # noqa: F401
import tf_transformer.run.runner  # noqa: F401  (the package, not its flags)
# The platforms' probes (on a machine without a GPU, CUDA's "failed call to
# cuInit" line) happen here, once, not in each command's stderr; they start
# no thread pool, and the children may still configure logical devices.
tensorflow.config.list_physical_devices()
# What the imports made (some 400,000 objects) leaves the collector's view:
# each child's full collections would walk them all again, and write to
# every page they share with the zygote.
gc.freeze()
requests, replies = sys.stdin, sys.stdout
background = set()
for line in requests:
  request = json.loads(line)
  if "poll" in request:
    done, waited = os.waitpid(request["poll"], os.WNOHANG)
    if done:
      background.discard(done)
    replies.write(json.dumps({"status": os.waitstatus_to_exitcode(waited)
                              if done else None}) + "\n")
    replies.flush()
    continue
  out, err = request["stdout"], request["stderr"]
  pid = os.fork()
  if pid == 0:
    if request.get("env") is not None:
      os.environ.clear()
      os.environ.update(request["env"])
    os.chdir(request["cwd"])
    stdin = os.open(request["stdin"], os.O_RDONLY)
    os.dup2(stdin, 0)
    for fd, path in ((1, out), (2, err)):
      os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    sys.stdin = os.fdopen(0, "r", encoding="utf-8", closefd=False)
    sys.stdout = os.fdopen(1, "w", encoding="utf-8", closefd=False)
    sys.stderr = os.fdopen(2, "w", encoding="utf-8", closefd=False)
    sys.argv = request["argv"]
    sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
    status = 0
    try:
      runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as e:
      status = e.code if isinstance(e.code, int) else (e.code is not None)
    except BaseException:  # what the interpreter would print, and its status
      import traceback
      traceback.print_exc()
      status = 1
    # What the interpreter runs at exit and os._exit skips: AutoGraph's
    # removal of its generated files (tf.data converts map functions).
    import atexit
    atexit._run_exitfuncs()  # pylint: disable=protected-access
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
      try:
        stream.flush()
      except Exception:  # a reader that left
        pass
    os._exit(status)
  replies.write(json.dumps({"pid": pid}) + "\n")
  replies.flush()
  if request.get("background"):
    background.add(pid)
    continue
  _, waited = os.waitpid(pid, 0)
  status = os.waitstatus_to_exitcode(waited)
  replies.write(json.dumps({"status": status}) + "\n")
  replies.flush()
for pid in background:
  try:
    os.kill(pid, 9)
  except ProcessLookupError:
    pass
"""


class Zygote:
  """One forking server of commands, started at its first use."""

  def __init__(self, environment):
    self._environment = environment
    self._process = None
    self._lock = threading.Lock()

  def _start(self):
    self._process = subprocess.Popen(
        [sys.executable, "-c", _SERVE], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env=self._environment)

  def _request(self, request):
    """Sends `request`; returns the zygote's first reply (the lock held)."""
    if self._process is None or self._process.poll() is not None:
      self._start()
    self._process.stdin.write(json.dumps(request) + "\n")
    self._process.stdin.flush()
    reply = self._process.stdout.readline()
    if not reply:
      raise RuntimeError("the command zygote died")
    return json.loads(reply)

  def start(self, argv, cwd, stdout, stderr, env=None):
    """`argv` (the script first) started in a fork, stdout and stderr to
    the files named (os.devnull to drop them), in `env` (all of it, as
    Popen's `env`; variables read at import take the zygote's values);
    returns a `Started` at once, as `subprocess.Popen` returns (the files
    made first, as Popen's caller opens them)."""
    for path in (stdout, stderr):
      open(path, "w", encoding="utf-8").close()
    with self._lock:
      pid = self._request(dict(argv=list(argv), cwd=cwd, stdin=os.devnull,
                               stdout=str(stdout), stderr=str(stderr),
                               env=env, background=True))["pid"]
    return Started(self, argv, pid, stdout, stderr)

  def poll(self, pid):
    """The exit status of background command `pid`, None while it runs."""
    with self._lock:
      return self._request({"poll": pid})["status"]

  def run(self, argv, cwd, input_text, timeout):
    """`argv` (the script first) run in a fork: a CompletedProcess as
    `subprocess.run(..., capture_output=True, text=True)` returns."""
    with self._lock, tempfile.TemporaryDirectory() as scratch:
      paths = {name: os.path.join(scratch, name)
               for name in ("stdin", "stdout", "stderr")}
      with open(paths["stdin"], "w", encoding="utf-8") as f:
        f.write(input_text or "")
      pid = self._request(dict(paths, argv=list(argv), cwd=cwd))["pid"]
      timer = threading.Timer(timeout, os.kill, (pid, 9))
      timer.start()
      try:
        reply = self._process.stdout.readline()
      finally:
        timer.cancel()
      if not reply:
        raise RuntimeError("the command zygote died")
      status = json.loads(reply)["status"]
      if status == -9:
        raise subprocess.TimeoutExpired(argv, timeout)
      read = lambda name: open(paths[name], encoding="utf-8",
                               errors="replace").read()
      return subprocess.CompletedProcess(
          [sys.executable, *argv], status, read("stdout"), read("stderr"))


class Started:
  """A command `Zygote.start` started: what tests use of `subprocess.Popen`
  (pid, poll, wait, send_signal, kill, communicate, returncode), its
  stdout and stderr read from their files once it ends."""

  def __init__(self, zygote, argv, pid, stdout, stderr):
    self._zygote, self.args, self.pid = zygote, argv, pid
    self._paths = (stdout, stderr)
    self.returncode = None

  def poll(self):
    if self.returncode is None:
      self.returncode = self._zygote.poll(self.pid)
    return self.returncode

  def wait(self, timeout=None):
    deadline = None if timeout is None else time.monotonic() + timeout
    while self.poll() is None:
      if deadline is not None and time.monotonic() > deadline:
        raise subprocess.TimeoutExpired(self.args, timeout)
      time.sleep(0.05)
    return self.returncode

  def send_signal(self, signal_number):
    if self.returncode is None:
      os.kill(self.pid, signal_number)

  def kill(self):
    self.send_signal(signal.SIGKILL)

  def communicate(self, timeout=None):
    """(stdout, stderr) text once the command ends."""
    self.wait(timeout)
    return tuple(None if path == os.devnull else open(
        path, encoding="utf-8", errors="replace").read()
                 for path in self._paths)
