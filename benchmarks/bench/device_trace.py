"""Where a JAX training step's device time goes, from a `jax.profiler`
trace rather than estimates (`benchmarks/gpu_check.py --profile_dir`).

`trace_steps` runs a few steps of a jitted step under `jax.profiler.trace`
with a Perfetto trace written beside the XPlane one; `summarize` reads that
trace (Chrome trace-event JSON, durations in microseconds) and totals the
complete events of each device thread by name: on a GPU the kernels of
each stream and, where the profiler records them, the XLA ops and modules
they belong to. Host threads (`/host:CPU`: Python, the runtime) are left
out: they overlap the device's work. Given the compiled step's HLO text,
each name that is an HLO instruction (a fusion's kernel, a cuBLAS call) is
annotated with its output shape and the op it came from, which names the
model's layer (Keras' name scopes reach JAX's `op_name` metadata), and
each thread's time is also totalled by part of the model (`part_of`): the
attention projections and core, the feed-forward, layer norms, dropout's
random bits, the logits and loss, Adam, each split into matmuls and the
rest. Nothing here imports TensorFlow.
"""

import collections
import glob
import gzip
import json
import os
import re

# `%name = shape op(...)` in HLO text; a tuple shape is in parentheses.
_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(\([^=]*?\)|\S+)\s+([\w\-]+)\(")
_OP_NAME = re.compile(r'op_name="([^"]*)"')


def trace_steps(step, state, batch, steps, directory):
  """Runs `steps` steps under the profiler.

  Args:
    step: a jitted (state, *batch) -> (loss, state).
    state, batch: its arguments (the state is donated, so the new one is
      returned).
    steps: how many steps the trace holds.
    directory: the trace's log directory (created).
  Returns:
    The state after the steps.
  """
  import jax  # pylint: disable=g-import-not-at-top
  os.makedirs(directory, exist_ok=True)
  with jax.profiler.trace(directory, create_perfetto_trace=True):
    for _ in range(steps):
      loss, state = step(state, *batch)
    loss.block_until_ready()
  return state


def trace_file(directory):
  """The newest Perfetto trace under `directory`, or None."""
  found = glob.glob(os.path.join(directory, "**", "perfetto_trace.json.gz"),
                    recursive=True)
  return max(found, key=os.path.getmtime) if found else None


def _key(name):
  """A kernel's name as an HLO instruction's: XLA names a fusion's kernel
  after the instruction, "." and "-" written "_"."""
  return re.sub(r"[.\-]", "_", name)


# An HLO instruction: its shape, opcode, fusion kind (or None), op_name
# without its "jit(...)/" prefix (or None), and whether it is a matmul.
_Instruction = collections.namedtuple(
    "_Instruction", "shape opcode kind op_name is_matmul")


def _parse_hlo(text):
  """{key: _Instruction} of HLO text's instructions."""
  found = {}
  for line in text.splitlines():
    # XLA numbers a long tuple's elements in comments: /*index=5*/.
    line = re.sub(r"/\*.*?\*/", "", line)
    match = _INSTRUCTION.match(line)
    if not match:
      continue
    name, shape, opcode = match.groups()
    shape = re.sub(r"\{[^{}]*\}", "", shape)  # layouts
    kind = re.search(r"kind=(k\w+)", line)
    op_name = _OP_NAME.search(line)
    # A dot, a cuBLAS / cuBLASLt / cuDNN attention call, or a Triton GEMM
    # fusion (its backend config's kind); not a fusion that merely reads
    # a GEMM's output.
    is_matmul = (opcode in ("dot", "convolution") or
                 re.search(r'custom_call_target="[^"]*(gemm|matmul|fmha)|'
                           r'"kind":"__(triton\w*gemm|cublas)', line)
                 is not None)
    found[_key(name)] = _Instruction(
        shape, opcode, kind.group(1) if kind else None,
        re.sub(r"^jit[(][^)]*[)]/", "", op_name.group(1)) if op_name else None,
        is_matmul)
  return found


def hlo_instructions(text):
  """The instructions of HLO text, by `_key` of their names.

  Args:
    text: a compiled module's `as_text()`.
  Returns:
    {key: "shape opcode[, kind] <- op_name"}, op_name without its
    "jit(...)/" prefix.
  """
  return {key: _described(instruction)
          for key, instruction in _parse_hlo(text).items()}


def _described(instruction):
  """"shape opcode[, kind] <- op_name" of an `_Instruction`."""
  kind = f", {instruction.kind}" if instruction.kind else ""
  return " ".join([instruction.shape, instruction.opcode + kind] + (
      [f"<- {instruction.op_name}"] if instruction.op_name else []))


# (part, substrings of an op_name that place an op in it), first match
# wins: a dropout's random bits sit inside the residual block's scope, a
# residual block's layer norm inside it too.
_PARTS = (("dropout: random bits", ("_bernoulli", "_uniform", "threefry",
                                    "random_bits")),
          ("Adam", ("adam",)),
          ("layer norm", ("layer_norm",)),
          ("dropout", ("dropout",)),
          ("residual add", ("_residual",)),
          ("attention projections", ("attention/query", "attention/key",
                                     "attention/value", "attention/output")),
          ("attention core", ("attention",)),
          ("feed-forward", ("feed_forward",)),
          ("embeddings", ("embedding", "positions")))


# cuBLAS's kernels (nvjet_*, sm90_xmma_gemm_*, cutlass_*): inside a CUDA
# graph the trace names only the graph, not the call, so not the layer.
_CUBLAS_KERNEL = re.compile(r"nvjet|sm\d+_xmma|cutlass|gemm", re.IGNORECASE)
_CUBLAS_PART = "cuBLAS matmuls, layer not traced (in a CUDA graph)"


def part_of(op_name, is_matmul=False):
  """The part of the model an op belongs to, from its `op_name` (Keras'
  layer scopes): one of `_PARTS`' names; else "encoder/decoder, other"
  inside a stack (masks, say), and "logits, loss and the rest" outside
  (the logits are computed outside any layer's scope, the loss outside
  the model); " (matmul)" added for matmuls.

  Args:
    op_name: an HLO instruction's op_name metadata, or None.
    is_matmul: whether the instruction is a matmul (cuBLAS, a dot).
  Returns:
    The part's name; "unattributed" for None.
  """
  if op_name is None:
    return "unattributed"
  rest = ("encoder/decoder, other" if "coder" in op_name else
          "logits, loss and the rest")
  part = next((name for name, marks in _PARTS
               if any(mark in op_name for mark in marks)), rest)
  return part + (" (matmul)" if is_matmul else "")


def summarize(path, steps, top=40, hlo_text=None):
  """The device time of a trace by thread and event name, per step.

  Args:
    path: a Perfetto / Chrome trace-event JSON file, gzipped or not.
    steps: the steps the trace holds (totals are divided by it).
    top: the most names listed a thread.
    hlo_text: the traced step's compiled HLO, to annotate names with.
  Returns:
    {"steps", "threads": [{"process", "thread", "ms_per_step",
    "events_per_step", "top": [{"name", "ms_per_step", "share",
    "calls_per_step", "hlo"}], "parts": [{"part", "ms_per_step",
    "share"}]}]}, threads by time, busiest first; "hlo" is the
    instruction's shape, opcode and op (`hlo_instructions`), or None;
    "parts" totals every event by `part_of` its instruction, largest
    first. An event is matched to its instruction by its name (a
    fusion's kernel, an XLA op), else by its "hlo_op" argument where the
    profiler records one (a kernel of a cuBLAS call; inside a CUDA graph
    that is the command buffer's). No threads where the trace has no
    device process (a CPU run).
  """
  parsed = _parse_hlo(hlo_text) if hlo_text else {}
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rt") as f:
    trace = json.load(f)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  processes, threads = {}, {}
  for e in events:
    if e.get("ph") != "M":
      continue
    if e.get("name") == "process_name":
      processes[e["pid"]] = e["args"]["name"]
    elif e.get("name") == "thread_name":
      threads[(e["pid"], e["tid"])] = e["args"]["name"]
  device = {pid for pid, name in processes.items()
            if name.startswith("/device:")}
  totals = collections.defaultdict(lambda: collections.defaultdict(
      lambda: [0.0, 0]))
  parts = collections.defaultdict(collections.Counter)
  keys = {}  # an event name's instruction key
  for e in events:
    if e.get("ph") == "X" and e.get("pid") in device:
      thread, us = (e["pid"], e.get("tid")), float(e.get("dur", 0.0))
      entry = totals[thread][e["name"]]
      entry[0] += us
      entry[1] += 1
      key = _key(e["name"])
      if key not in parsed:  # a cuBLAS kernel, say
        key = _key((e.get("args") or {}).get("hlo_op") or e["name"])
      keys.setdefault(e["name"], key)
      found = parsed.get(key)
      parts[thread][part_of(found.op_name, found.is_matmul) if found else
                    _CUBLAS_PART if _CUBLAS_KERNEL.match(e["name"]) else
                    "unattributed"] += us
  summary = []
  for (pid, tid), names in totals.items():
    busy = sum(us for us, _ in names.values())
    ranked = sorted(names.items(), key=lambda item: -item[1][0])[:top]
    summary.append({
        "process": processes[pid],
        "thread": threads.get((pid, tid), str(tid)),
        "ms_per_step": busy / 1000 / steps,
        "events_per_step": sum(n for _, n in names.values()) / steps,
        "top": [{"name": name, "ms_per_step": us / 1000 / steps,
                 "share": us / busy if busy else 0.0,
                 "calls_per_step": n / steps,
                 "hlo": (_described(parsed[keys[name]])
                         if keys[name] in parsed else None)}
                for name, (us, n) in ranked],
        "parts": [{"part": part, "ms_per_step": us / 1000 / steps,
                   "share": us / busy if busy else 0.0}
                  for part, us in parts[(pid, tid)].most_common()]})
  summary.sort(key=lambda thread: -thread["ms_per_step"])
  return {"steps": steps, "threads": summary}


def markdown(label, summary, threads=3, top=12):
  """A row's busiest device threads as markdown lines: each one's `top`
  names and its time by part of the model."""
  lines = [f"Device time of {label}, per step, from a "
           f"{summary['steps']}-step trace:"]
  if not summary["threads"]:
    return lines + ["(no device events: a CPU run)"]
  for thread in summary["threads"][:threads]:
    lines += ["", f"{thread['process']} {thread['thread']}: "
              f"{thread['ms_per_step']:.2f} ms, "
              f"{thread['events_per_step']:.0f} events", "",
              "| name | ms | share | calls | HLO |",
              "| --- | ---: | ---: | ---: | --- |"]
    lines += [f"| `{t['name'][:80]}` | {t['ms_per_step']:.3f} | "
              f"{100 * t['share']:.1f}% | {t['calls_per_step']:.0f} | "
              f"{(t.get('hlo') or '-')[:160]} |"
              for t in thread["top"][:top]]
    if thread.get("parts"):
      lines += ["", "| part of the model | ms | share |",
                "| --- | ---: | ---: |"]
      lines += [f"| {p['part']} | {p['ms_per_step']:.3f} | "
                f"{100 * p['share']:.1f}% |" for p in thread["parts"]]
  return lines
