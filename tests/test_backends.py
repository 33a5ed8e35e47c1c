"""The public layers and the model's training path on Keras' JAX and
PyTorch backends (issue: the Keras layers on every Keras 3 backend).

Each check runs in a fresh interpreter with KERAS_BACKEND set (Keras picks
its backend once, at import). JAX and PyTorch run here on the CPU;
benchmarks/gpu_check.py runs the same code on a GPU under JAX.
"""

import gzip
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import attention_core
from bench import device_trace
from bench import gpu_check
from conftest import made_once
import rounding
from tf_transformer.run import run_dir
from test_attention_core import assert_gaps_within_rounding

# Slow (README.md's quick tier leaves it out): the layers under JAX and
# PyTorch, each in a fresh interpreter.
pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BACKENDS = ["jax", "torch"]


def _under(backend, *args, timeout=900, env=None):
  # benchmarks/ on the path: the measuring tools' library, `bench`.
  env = dict(os.environ, **(env or {}), KERAS_BACKEND=backend,
             TF_CPP_MIN_LOG_LEVEL="2",
             JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES="",
             PYTHONPATH=os.pathsep.join(filter(None, [
                 os.path.join(REPO, "benchmarks"),
                 os.environ.get("PYTHONPATH")])))
  return subprocess.run([sys.executable, *args], capture_output=True,
                        text=True, timeout=timeout, env=env, cwd=REPO)


def _under_jax(*args, timeout=900):
  return _under("jax", *args, timeout=timeout)


# Runs the checks given as JSON ({name: code}), in their order, in one
# interpreter, each in a namespace of its own that leaves its figures in
# `result`; prints {name: result, or {"error": traceback}}, and under
# "tensorflow loaded" whether TensorFlow had been imported after each.
_RUN_CHECKS = """
import json, sys, traceback
results, loaded = {}, {}
for name, code in json.loads(sys.argv[1]).items():
  scope = {}
  try:
    exec(compile(code, name, "exec"), scope)
    results[name] = scope["result"]
  except Exception:
    results[name] = {"error": traceback.format_exc()}
  loaded[name] = "tensorflow" in sys.modules
results["tensorflow loaded"] = loaded
print(json.dumps(results))
"""


_REFERENCE = {}


def made_reference_weights():
  """The folder of the reference weights the checks read (written once a
  session by `_checks`)."""
  return str(_REFERENCE["folder"])


@pytest.fixture(scope="session", name="checks")
def _checks(tmp_path_factory):
  _REFERENCE["folder"] = made_once(tmp_path_factory, "reference_weights",
                                   attention_core.write_weights)
  reference_weights = lambda: _REFERENCE["folder"]

  """checks(backend)[name]: the result of check `name` (the snippets
  below), all of a backend's run in one fresh interpreter once a session
  (Keras picks its backend at import; each interpreter costs the
  backend's import, 5-9 s), not one interpreter a check."""
  def under(backend):
    def run(folder):
      done = _under(backend, "-c", _RUN_CHECKS, json.dumps(
          {name: code for name, code in _CHECKS.items()
           if backend in _BACKENDS_OF.get(name, BACKENDS)}),
                    env={"REFERENCE_WEIGHTS": str(reference_weights())})
      assert done.returncode == 0, done.stderr[-3000:]
      (folder / "checks.json").write_text(
          done.stdout.strip().splitlines()[-1])
    folder = made_once(tmp_path_factory, f"checks_{backend}", run)
    return json.loads((folder / "checks.json").read_text())
  return under


def _result(checks, backend, name):
  found = checks(backend)[name]
  assert "error" not in found, found["error"]
  return found


# The generic layer test and the README's classifier, by pytest, in the
# checks' interpreter and after them: its conftest imports TensorFlow.
_LAYER_CONVENTIONS = """
import contextlib, io
import pytest

class Outcomes:
  # pytest's "error" is counted as "errors": a check's own "error" is its
  # traceback.
  def pytest_terminal_summary(self, terminalreporter):
    stats = terminalreporter.stats
    self.counts = {name: len(stats.get(key, [])) for name, key in (
        ("passed", "passed"), ("failed", "failed"), ("skipped", "skipped"),
        ("errors", "error"))}

outcomes, output = Outcomes(), io.StringIO()
with contextlib.redirect_stdout(output):
  status = pytest.main(["-q", "-p", "no:cacheprovider",
                        "tests/test_layer_conventions.py",
                        "tests/test_keras_reuse.py"], plugins=[outcomes])
result = {"status": int(status), "output": output.getvalue()[-4000:],
          **outcomes.counts}
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_layer_conventions_and_the_readme_classifier_hold(backend, checks):
  """The generic layer test (config and saving round trips, symbolic =
  eager, a compiled call and fit step, dtype policies) and the README's
  classifier (trained, saved, reloaded) pass under JAX and PyTorch."""
  found = _result(checks, backend, "layer_conventions")
  assert found["status"] == 0, found["output"]
  assert found["passed"] > 90, found
  assert found["failed"] == found["skipped"] == found["errors"] == 0, found


_TRAINING = """
import keras
import numpy as np
import tf_transformer.config, tf_transformer.layers, tf_transformer.model
from tf_transformer.training import loss, optimizer
config = tf_transformer.config.get_config("tiny")
model = tf_transformer.model.build_model(config)
model.compile(optimizer=optimizer.create_optimizer(config),
              loss=loss.LabelSmoothedCrossEntropy(),
              jit_compile=keras.backend.backend() == "jax")
ids = np.array([[5, 6, 7, 2]], np.int32)
result = {"loss": float(model.train_on_batch((ids, ids), ids))}
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_layers_model_config_and_loss_import_no_tensorflow(backend,
                                                               checks):
  """Under JAX and PyTorch, building the model and training it (the
  label-smoothed loss, Adam with eq. 3) imports no TensorFlow (the first
  check of its interpreter). (Under PyTorch the step runs eagerly: Keras'
  `jit_compile` there is `torch.compile`, over a minute to trace this step
  on a CPU.)"""
  assert np.isfinite(_result(checks, backend, "training")["loss"])
  assert list(_CHECKS)[0] == "training"
  assert checks(backend)["tensorflow loaded"]["training"] is False


_TEACHER_FORCING = """
import json, os, sys, tempfile
sys.path.insert(0, "tests")
import keras
import numpy as np
import attention_core
# The tiny model of the reference weights (tests/attention_core.py): the
# parent computes the bounds from the same weights.
_, model = attention_core.layers_of(os.environ["REFERENCE_WEIGHTS"])
source, target = attention_core.SOURCE, attention_core.TARGET
numpy = keras.ops.convert_to_numpy
logits = numpy(model((source, target)))
memory, source_mask = model.encode(source)
two_steps = numpy(model.decode(target, memory, source_mask))
weights = model.attention_weights(source, target)
rows = [numpy(w) for kind in weights.values() for w in kind]
cross = numpy(weights["encoder_decoder"][0])
decoder_self = numpy(weights["decoder_self"][0])
with tempfile.TemporaryDirectory() as folder:
  path = os.path.join(folder, "m.keras")
  model.save(path)
  loaded = keras.models.load_model(path, safe_mode=True)
result = {
    "dtype": str(logits.dtype), "shape": list(logits.shape),
    "logits": logits.tolist(), "two_steps": two_steps.tolist(),
    "row_sums": float(max(np.abs(r.sum(-1) - 1).max() for r in rows)),
    "keys": max(r.shape[-1] for r in rows),
    "on_padding": float(cross[1, :, :, 3].max()),
    "above_diagonal": float(np.triu(decoder_self, 1).max()),
    "layers": {k: len(v) for k, v in weights.items()},
    "loaded": float(np.abs(numpy(loaded((source, target))) - logits).max()),
}
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_models_teacher_forcing_path_and_saving(backend, checks):
  """`Transformer.encode` then `decode` give `call`'s float32 logits;
  `attention_weights` are distributions (rows sum to 1) with no weight on
  source padding, and causal in the decoder; a `.keras` file saved and
  loaded under the backend gives the same logits (the same operations on
  the same weights: the same numbers)."""
  check = _result(checks, backend, "teacher_forcing")
  assert check["dtype"] == "float32" and check["shape"] == [2, 3, 1000]
  # call, and encode then decode: two computations, each within its float32
  # bound (rounding.py; the same weights under TensorFlow) at the real
  # target positions.
  _, model = attention_core.layers_of(made_reference_weights())
  sources = rounding.unpadded(attention_core.SOURCE)
  cells = [(row, t) for row, target in enumerate(attention_core.TARGET)
           for t in range(len(target)) if t == 0 or target[t]]
  _, bound = rounding.vocabulary_logit_bounds(
      model, [sources[row] for row, _ in cells],
      [list(attention_core.TARGET[row, 1:t + 1]) for row, t in cells])
  logits, two_steps = (np.asarray(check[key]) for key in ("logits",
                                                          "two_steps"))
  rounding.assert_within(np.stack([two_steps[r, t] for r, t in cells]),
                         np.stack([logits[r, t] for r, t in cells]),
                         2 * bound)
  # Each row a float32 softmax's quotients (L keys): within 2 L + 2
  # roundings of 1 (the sum of the exponentials, the quotients, their sum).
  assert check["row_sums"] <= (2 * check["keys"] + 2) * rounding.U32, check
  assert check["on_padding"] == 0.0 and check["above_diagonal"] == 0.0, check
  assert check["layers"] == {"encoder_self": 2, "decoder_self": 2,
                             "encoder_decoder": 2}, check
  assert check["loaded"] == 0.0, check


def test_weights_trained_on_tensorflow_give_the_same_logits(
    trained_numbers_run, tmp_path):
  """A .weights.h5 saved from a TensorFlow-trained model loads into a
  JAX-backend and a PyTorch-backend model and gives the same logits within
  float32 rounding (all on this CPU: only the order of float32 sums
  differs; each within its float32 bound, tests/rounding.py)."""
  model, _ = run_dir.load_trained_model(str(trained_numbers_run))
  logits = gpu_check.write_reference(str(tmp_path), model)
  assert np.abs(logits).max() > 5.0  # a trained model, not near-zero logits
  code = ("import json; from bench import gpu_check; "
          f"print(json.dumps(gpu_check.check_logits({str(tmp_path)!r})))")
  for backend in BACKENDS:
    done = _under(backend, "-c", code)
    assert done.returncode == 0, done.stderr[-3000:]
    check = json.loads(done.stdout.strip().splitlines()[-1])
    assert check["device"] == "cpu", (backend, check)
    assert check["max_abs_diff"] <= _reference_bound(tmp_path, model), (
        backend, check)


def _reference_bound(directory, model):
  """The largest bound (rounding.py) on two float32 computations of the
  logits of `gpu_check.write_reference`'s batch in `directory` (of
  `model`'s weights): the largest difference two backends may show."""
  batch = np.load(os.path.join(directory, "batch.npz"))
  source, target = batch["source"], batch["target_input"]
  cells = [(row, t) for row in range(len(target))
           for t in range(target.shape[1])]
  _, bound = rounding.vocabulary_logit_bounds(
      model, [list(source[row]) for row, _ in cells],
      [list(target[row, 1:t + 1]) for row, t in cells])
  return 2 * float(bound.max())


_REPEATED_TOKEN_GRADIENT = """
import json
import keras
import numpy as np
from tf_transformer import layers

layer = layers.SharedEmbedding(4, 8, scale=False, dtype="mixed_bfloat16")
layer.build()
ids = np.zeros((4096,), "int32")  # one token, 4096 times
backend = keras.backend.backend()
if backend == "jax":
  import jax, jax.numpy as jnp
  def total(table):
    out, _ = layer.stateless_call([table], [], ids)
    return jnp.sum(out.astype("float32"))
  grad = jax.grad(total)(layer.embeddings.value)
elif backend == "torch":
  import torch
  layer(torch.as_tensor(ids)).float().sum().backward()
  grad = layer.embeddings.value.grad
else:
  import tensorflow as tf
  with tf.GradientTape() as tape:
    total = tf.reduce_sum(tf.cast(layer(ids), "float32"))
  grad = tf.convert_to_tensor(tape.gradient(total, layer.embeddings.value))
result = {
    "output": keras.backend.standardize_dtype(layer(ids[:2]).dtype),
    "grad": keras.backend.standardize_dtype(grad.dtype),
    "row": keras.ops.convert_to_numpy(grad)[0].tolist(),
    "others": float(np.abs(keras.ops.convert_to_numpy(grad)[1:]).max())}
"""


@pytest.mark.parametrize("backend", BACKENDS + ["tensorflow"])
def test_a_repeated_tokens_embedding_gradient_sums_in_float32(backend,
                                                              checks):
  """Under mixed_bfloat16 the lookup is bfloat16 but the table's gradient
  sums in float32: 4096 lookups of one token give 4096 (a sum in bfloat16
  stops at 256, where adding 1 no longer changes it; JAX and PyTorch did
  that while the rows were gathered from a bfloat16 copy of the table)."""
  if backend == "tensorflow":  # this process's own backend
    scope = {}
    exec(compile(_REPEATED_TOKEN_GRADIENT, "embedding_gradient", "exec"),
         scope)
    found = scope["result"]
  else:
    found = _result(checks, backend, "embedding_gradient")
  assert found == {"output": "bfloat16", "grad": "float32",
                   "row": [4096.0] * 8, "others": 0.0}, (backend, found)


def test_gpu_check_runs_on_the_cpu(tmp_path):
  """benchmarks/gpu_check.py, as the GPU runs it, on the tiny preset: every row
  trains with one compilation, each lever row is labelled and changes what
  it names, the logits match the TensorFlow reference, each row leaves a
  profiler trace (with no device threads on a CPU), and both files are
  written."""
  reference, output = tmp_path / "reference", tmp_path / "out"
  gpu_check.write_reference(str(reference))
  done = _under_jax(
      os.path.join(REPO, "benchmarks", "gpu_check.py"),
      # Two rows: the plain step, and one with every lever at once (each
      # still shows in what it changes: tokens, dropout, padding, policy,
      # the attention core).
      "--rows=tiny:float32,"
      "tiny:mixed_bfloat16:batch_2x+no_dropout+no_ffn_padding"
      "+unfused_attention",
      "--vocab_size=1000", "--batch_tokens=256", "--sequence_length=16",
      "--max_steps=3", "--seconds=1", f"--reference={reference}",
      f"--output_dir={output}", f"--profile_dir={tmp_path / 'traces'}",
      "--profile_steps=2")
  assert done.returncode == 0, done.stderr[-3000:]
  figures = json.loads((output / "gpu_check.json").read_text())
  rows = figures["training"]
  assert [(r["policy"], r["lever"], r["hparams"]) for r in rows] == [
      ("float32", None, ""),
      ("mixed_bfloat16", "batch_2x+no_dropout+no_ffn_padding"
       "+unfused_attention", "dropout_rate=0.0")], rows
  for row in rows:
    assert "error" not in row, row
    assert row["compilations"] == 1 and row["steps"] == 3, row
    assert row["tokens_per_second"] > 0 and np.isfinite(row["final_loss"])
    assert row["mfu"] is None  # no known peak for a CPU
    assert row["profile"] == {"steps": 2, "threads": []}, row["profile"]
  assert [r["tokens_per_step"] for r in rows] == [2 * 16 * 16,
                                                  2 * 2 * 16 * 16]
  assert [r["ffn_padding"] for r in rows] == [True, False]
  assert [r["fused_attention"] for r in rows] == [True, False]
  assert [r["flash_attention"] for r in rows] == [False, False]  # no cuDNN
  for label in ("tiny_float32", "tiny_mixed_bfloat16_batch_2x-no_dropout-"
                "no_ffn_padding-unfused_attention"):
    assert device_trace.trace_file(str(tmp_path / "traces" / label))
    with gzip.open(tmp_path / "traces" / label / gpu_check.HLO_FILE,
                   "rt") as f:
      instructions = device_trace.hlo_instructions(f.read())
    # The step's compiled HLO, its ops named after the model's layers.
    assert len(instructions) > 100
    assert any("decoder" in i and "self_attention" in i
               for i in instructions.values())
    # tiny's d_ff=256 is padded to 272 float32s (1024 bytes a row), but
    # not under the lever.
    padded = any(re.search(r"[\[,]272\]", i) for i in instructions.values())
    assert padded == (label == "tiny_float32"), label
  _, reference_model = _reference_model(str(reference))
  assert figures["logits"]["max_abs_diff"] <= _reference_bound(
      reference, reference_model), figures["logits"]
  table = (output / "gpu_check.md").read_text()
  assert table.count("| tiny |") == 2 and "no_dropout" in table
  assert "(no device events: a CPU run)" in table
  assert "Logits against the TensorFlow CPU reference" in table


def _reference_model(directory):
  """(config, model) of `gpu_check.write_reference`'s files, here under
  TensorFlow."""
  from tf_transformer import config as config_lib  # pylint: disable=g-import-not-at-top
  from tf_transformer import model as model_lib  # pylint: disable=g-import-not-at-top
  with open(os.path.join(directory, "config.json")) as f:
    config = config_lib.TransformerConfig.from_dict(json.load(f))
  model = model_lib.build_model(config, dtype="float32")
  model.load_weights(os.path.join(directory, "model.weights.h5"))
  return config, model


def test_a_trace_summary_totals_each_device_thread_per_step(tmp_path):
  """`device_trace.summarize` on a hand-written trace (two steps): device
  threads only, by name, busiest first, per step; host events left out;
  each thread's time by part of the model, a cuBLAS kernel placed by its
  "hlo_op" argument, a fusion's by its name."""
  meta = lambda pid, tid, kind, name: {"ph": "M", "pid": pid, "tid": tid,
                                       "name": kind, "args": {"name": name}}
  event = lambda pid, tid, name, dur, **args: {
      "ph": "X", "pid": pid, "tid": tid, "name": name, "ts": 0, "dur": dur,
      **({"args": args} if args else {})}
  trace = {"traceEvents": [
      meta(1, 0, "process_name", "/host:CPU"),
      meta(2, 0, "process_name", "/device:GPU:0"),
      meta(2, 7, "thread_name", "Stream #13(Compute)"),
      meta(2, 8, "thread_name", "XLA Ops"),
      event(1, 5, "PjitFunction(step)", 9000.0),
      event(2, 7, "nvjet_gemm", 3000.0), event(2, 7, "nvjet_gemm", 3000.0),
      event(2, 7, "loop_add_fusion_2", 1000.0),
      event(2, 7, "sm90_xmma_gemm_bf16", 400.0, hlo_op="dot.3"),
      event(2, 8, "dot.3", 5000.0)]}
  path = tmp_path / "perfetto_trace.json.gz"
  with gzip.open(path, "wt") as f:
    json.dump(trace, f)
  # Compiled HLO as XLA prints it: a kernel is named after its fusion
  # ("." written "_"), an XLA op after its instruction.
  hlo = "\n".join([
      "ENTRY %main.9 (p: bf16[4,8]) -> (f32[], bf16[4,8]) {",
      "  %loop_add_fusion.2 = bf16[4,8]{1,0} fusion(%p, %p), kind=kLoop, "
      'calls=%fused_add, metadata={op_name="jit(step)/jvp(decoder)/'
      'layer_0/add" stack_frame_id=3}',
      "  %dot.3 = (f32[4,8]{1,0}, s8[0]{0}) custom-call(%p, %p), "
      'custom_call_target="__cublas$gemm", metadata={op_name='
      '"jit(step)/transpose(jvp(logits))/dot_general"}',
      "  ROOT %tuple = (f32[], bf16[4,8]{1,0}) tuple(%c, %p)", "}"])
  summary = device_trace.summarize(str(path), steps=2, hlo_text=hlo)
  threads = summary["threads"]
  assert [t["thread"] for t in threads] == ["Stream #13(Compute)", "XLA Ops"]
  stream = threads[0]
  assert stream["process"] == "/device:GPU:0"
  assert stream["ms_per_step"] == 3.7 and stream["events_per_step"] == 2
  assert stream["top"][0] == {"name": "nvjet_gemm", "ms_per_step": 3.0,
                              "share": 6000 / 7400, "calls_per_step": 1.0,
                              "hlo": None}
  assert stream["top"][1]["hlo"] == (
      "bf16[4,8] fusion, kLoop <- jvp(decoder)/layer_0/add")
  assert stream["top"][2]["hlo"] == threads[1]["top"][0]["hlo"] == (
      "(f32[4,8], s8[0]) custom-call <- transpose(jvp(logits))/dot_general")
  assert [(p["part"], round(p["ms_per_step"], 6)) for p in stream["parts"]] == [
      ("cuBLAS matmuls, layer not traced (in a CUDA graph)", 3.0),
      ("encoder/decoder, other", 0.5),
      ("logits, loss and the rest (matmul)", 0.2)]
  assert threads[1]["parts"] == [{
      "part": "logits, loss and the rest (matmul)", "ms_per_step": 2.5,
      "share": 1.0}]
  assert device_trace.trace_file(str(tmp_path)) == str(path)
  table = "\n".join(device_trace.markdown("base", summary))
  assert "| `nvjet_gemm` | 3.000 | 81.1% | 1 | - |" in table
  assert "| `loop_add_fusion_2` | 0.500 | 13.5% | 0 | bf16[4,8] fusion" in table
  assert "| encoder/decoder, other | 0.500 | 13.5% |" in table


@pytest.mark.parametrize("op_name, is_matmul, part", [
    ("jvp(decoder)/layer_1/self_attention_residual/dropout_10/"
     "jit(_bernoulli)/jit(_uniform)/threefry2x32", False,
     "dropout: random bits"),
    ("transpose(jvp(encoder))/layer_0/feed_forward_residual/layer_norm/"
     "jit(_var)/reduce_sum", False, "layer norm"),
    ("jvp(decoder)/layer_0/cross_attention_residual/dropout_16/mul", False,
     "dropout"),
    ("jvp(encoder)/layer_2/self_attention_residual/add", False,
     "residual add"),
    ("transpose(jvp(decoder))/layer_3/cross_attention/key/dot_general", True,
     "attention projections (matmul)"),
    ("jvp(encoder)/layer_0/self_attention/attention/softmax", False,
     "attention core"),
    ("jvp(decoder)/layer_5/feed_forward/dense_1/dot_general", True,
     "feed-forward (matmul)"),
    ("jvp(shared_embedding)/jit(_take)/add", False, "embeddings"),
    ("jvp(decoder)/and", False, "encoder/decoder, other"),
    ("adam/sqrt", False, "Adam"),
    ("transpose(jvp())/dot_general", True,
     "logits, loss and the rest (matmul)"),
    (None, False, "unattributed")])
def test_each_op_is_placed_in_a_part_of_the_model(op_name, is_matmul, part):
  """`device_trace.part_of` by the Keras layer scopes in an op's name."""
  assert device_trace.part_of(op_name, is_matmul) == part


_LOSS_GRADIENT_JAX = """
import jax, jax.numpy as jnp, numpy as np
from tf_transformer.training import loss
rng = np.random.default_rng(0)
logits = jnp.asarray(rng.normal(size=(2, 5, 11)) * 3, jnp.float32)
labels = jnp.asarray([[4, 7, 2, 0, 0], [5, 6, 9, 10, 3]], jnp.int32)
def textbook(z):
  log_p = jax.nn.log_softmax(z)
  target = 0.9 * jax.nn.one_hot(labels, 11) + 0.1 / 11
  weights = (labels != 0).astype(jnp.float32)
  return jnp.sum(-jnp.sum(target * log_p, -1) * weights) / jnp.sum(weights)
ours = lambda z: loss.label_smoothed_cross_entropy(labels, z, 0.1)
# Our loss is the textbook one less a constant (the smoothed target's
# entropy), so the gradients are equal.
gap = np.abs(np.asarray(jax.grad(ours)(logits) - jax.grad(textbook)(logits)))
result = {"gap": gap.tolist()}
"""


def test_the_closed_form_loss_gradient_equals_autodiff_under_jax(checks):
  """The label-smoothed loss's hand-written gradient (its custom_gradient
  under JAX) equals JAX's autodiff of the textbook formula, padding
  included."""
  gap = np.asarray(_result(checks, "jax", "loss_gradient_jax")["gap"])
  rounding.assert_within(gap, 0.0, _loss_gradient_bound())


_LOSS_GRADIENT_TORCH = """
import numpy as np, torch
from tf_transformer.training import loss
rng = np.random.default_rng(0)
logits = torch.tensor(rng.normal(size=(2, 5, 11)) * 3, dtype=torch.float32)
labels = torch.tensor([[4, 7, 2, 0, 0], [5, 6, 9, 10, 3]])
def textbook(z):
  log_p = torch.log_softmax(z, -1)
  target = 0.9 * torch.nn.functional.one_hot(labels, 11) + 0.1 / 11
  weights = (labels != 0).float()
  return torch.sum(-torch.sum(target * log_p, -1) * weights) / weights.sum()
def grad(fn):
  z = logits.clone().requires_grad_(True)
  fn(z).backward()
  return z.grad
ours = lambda z: loss.label_smoothed_cross_entropy(labels, z, 0.1)
result = {"gap": (grad(ours) - grad(textbook)).abs().tolist()}
"""


def test_the_closed_form_loss_gradient_equals_autograd_under_torch(checks):
  """The same under PyTorch, whose `keras.ops.custom_gradient` is an
  autograd Function: the hand-written gradient equals torch's autograd of
  the textbook formula, padding included."""
  gap = np.asarray(_result(checks, "torch", "loss_gradient_torch")["gap"])
  rounding.assert_within(gap, 0.0, _loss_gradient_bound())


def _loss_gradient_bound():
  """Two float32 computations of the label-smoothed loss's gradient for
  the checks' logits (seeded, [2, 5, 11]): (softmax(z) - target) * w / n,
  each within (2 FUNCTION + 11 + 8) u of the magnitudes |softmax(z)| +
  |target| over n (the softmax's exponentials, its sum of 11 terms and
  quotient, the target's two products and sum, the difference, the
  weight's product and the division by the n = 8 real tokens)."""
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 5, 11)) * 3
  labels = np.array([[4, 7, 2, 0, 0], [5, 6, 9, 10, 3]])
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  target = 0.9 * np.eye(11)[labels] + 0.1 / 11
  weights = (labels != 0)[..., None]
  return 2 * (2 * rounding.FUNCTION + 19) * rounding.U32 * (
      probs + target) * weights / weights.sum()


_ATTENTION_CORE = """
import os, sys
sys.path.insert(0, "tests")
from attention_core import gaps
result = gaps(os.environ["REFERENCE_WEIGHTS"])
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_fused_attention_core_equals_the_one_with_weights(backend,
                                                              checks):
  """Under JAX and PyTorch `keras.ops.dot_product_attention` (the backends'
  own kernels) computes what eq. 1 with returned weights does, within
  float32 rounding (tests/test_attention_core.py's bound)."""
  found = _result(checks, backend, "attention_core")
  assert_gaps_within_rounding(found, made_reference_weights())


# The checks run by the `checks` fixture, and the backends each runs under
# where not all of BACKENDS.
_CHECKS = {"training": _TRAINING, "teacher_forcing": _TEACHER_FORCING,
           "embedding_gradient": _REPEATED_TOKEN_GRADIENT,
           "loss_gradient_jax": _LOSS_GRADIENT_JAX,
           "loss_gradient_torch": _LOSS_GRADIENT_TORCH,
           "attention_core": _ATTENTION_CORE,
           "layer_conventions": _LAYER_CONVENTIONS}  # last: see its code
_BACKENDS_OF = {"loss_gradient_jax": ["jax"],
                "loss_gradient_torch": ["torch"]}
