"""What this machine's CPU offers: its /proc/cpuinfo flags, its model name,
and whether it multiplies bfloat16 natively (which decides whether bfloat16
can be faster than float32 on it: the export's --dtype, the training's
mixed precision)."""

import platform

CPUINFO = "/proc/cpuinfo"
# /proc/cpuinfo flags of the instructions that multiply bfloat16 natively.
BFLOAT16_FLAGS = ("avx512_bf16", "amx_bf16")


def _field(cpuinfo, name):
  """The value of /proc/cpuinfo's first `name` line ("" where there is
  none), or None where the file cannot be read."""
  try:
    with open(cpuinfo, encoding="utf-8") as f:
      for line in f:
        if line.startswith(name):
          return line.split(":", 1)[1].strip()
  except OSError:
    return None
  return ""


def flags(cpuinfo=CPUINFO):
  """The CPU's /proc/cpuinfo flags as a set, or None where unreadable."""
  value = _field(cpuinfo, "flags")
  return None if value is None else set(value.split())


def bfloat16_flags(cpuinfo=CPUINFO):
  """The BFLOAT16_FLAGS this CPU has, upper-cased and sorted ([] where
  none), or None where /proc/cpuinfo cannot be read."""
  found = flags(cpuinfo)
  if found is None:
    return None
  return sorted(f.upper() for f in found & set(BFLOAT16_FLAGS))


def model_name(cpuinfo=CPUINFO):
  """The CPU's model name, or what `platform` knows."""
  return (_field(cpuinfo, "model name") or platform.processor()
          or platform.machine())
