"""Every public layer follows Keras 3's layer conventions, checked the way
keras-hub's generic layer test (`TestCase.run_layer_test`) checks its own:

- `get_config` and `keras.saving` round trips give the same config;
- `build(**{argument + "_shape": shape})`, with the shapes of the call's
  tensor arguments named as Keras 3 names them, creates the same weights as
  building by a call;
- a symbolic call (`KerasTensor`s) gives the eager call's shapes and dtypes;
- a call compiled with XLA (`tf.function(jit_compile=True)`, `jax.jit`;
  under torch, `torch.compile` with its `aot_eager` backend) gives the
  eager outputs, and a `model.fit` step compiled with XLA runs (eager under
  torch, see `FIT_JIT_COMPILE`);
- under "mixed_float16", "mixed_bfloat16" and "bfloat16" given as the
  layer's own `dtype`, every float output (eager and `compute_output_spec`)
  is in the compute dtype, every weight in the variable dtype, and every
  sublayer has the layer's policy.

Written here rather than imported so that CI does not install keras-hub and
its dependencies for one test class. Backend-neutral: `tests/test_backends.py`
runs this file under JAX and PyTorch too.
"""

import json
import os

import keras
import numpy as np
import pytest

import rounding
from tf_transformer import layers

pytestmark = pytest.mark.numeric
POLICIES = ["mixed_float16",
            pytest.param("mixed_bfloat16", marks=pytest.mark.bfloat16),
            pytest.param("bfloat16", marks=pytest.mark.bfloat16)]
BATCH, LENGTH, MEMORY_LENGTH, D_MODEL = 2, 3, 5, 8


def _floats(*shape, seed=0):
  return np.random.default_rng(seed).normal(size=shape).astype("float32")


def _padding(length):
  """[batch, length] bool, the second row one token shorter."""
  mask = np.ones((BATCH, length), bool)
  mask[1, -1] = False
  return mask


def _cases():
  """(layer class, init kwargs, call inputs: one array or a dict by call
  argument, the outputs' shapes)."""
  x = _floats(BATCH, LENGTH, D_MODEL)
  memory = _floats(BATCH, MEMORY_LENGTH, D_MODEL, seed=1)
  out = (BATCH, LENGTH, D_MODEL)
  stack = dict(num_heads=2, d_ff=16)
  causal = np.broadcast_to(np.tril(np.ones((LENGTH, LENGTH), bool)),
                           (BATCH, 1, LENGTH, LENGTH))
  memory_mask = _padding(MEMORY_LENGTH)[:, np.newaxis, np.newaxis, :]
  return {
      "ScaledDotProductAttention": (
          layers.ScaledDotProductAttention, {},
          {"query": _floats(BATCH, 2, LENGTH, 4),
           "key": _floats(BATCH, 2, MEMORY_LENGTH, 4, seed=1),
           "value": _floats(BATCH, 2, MEMORY_LENGTH, 4, seed=2),
           "attention_mask": memory_mask},
          ((BATCH, 2, LENGTH, 4), (BATCH, 2, LENGTH, MEMORY_LENGTH))),
      "MultiHeadAttention": (
          layers.MultiHeadAttention, dict(num_heads=2, d_k=4),
          {"query": x, "value": memory, "attention_mask": memory_mask}, out),
      "PositionwiseFeedForward": (
          layers.PositionwiseFeedForward, dict(d_ff=16), x, out),
      "ResidualNorm": (
          layers.ResidualNorm, {},
          {"x": x, "sublayer_output": _floats(*out, seed=1)}, out),
      "ResidualNorm-pre": (
          layers.ResidualNorm, dict(norm_position="pre"),
          {"x": x, "sublayer_output": _floats(*out, seed=1)}, out),
      "SharedEmbedding": (
          layers.SharedEmbedding, dict(vocab_size=20, d_model=D_MODEL),
          np.array([[4, 5, 6], [7, 8, 0]], np.int32), out),
      "SinusoidalPositionalEncoding": (
          layers.SinusoidalPositionalEncoding, {}, x, out),
      "LearnedPositionalEmbedding": (
          layers.LearnedPositionalEmbedding, dict(max_length=10), x, out),
      "EncoderLayer": (
          layers.EncoderLayer, stack,
          {"x": x, "padding_mask": _padding(LENGTH)}, out),
      "Encoder": (
          layers.Encoder, dict(num_layers=2, **stack),
          {"x": x, "padding_mask": _padding(LENGTH)}, out),
      "Encoder-pre": (
          layers.Encoder, dict(num_layers=2, norm_position="pre", **stack),
          {"x": x, "padding_mask": _padding(LENGTH)}, out),
      "DecoderLayer": (
          layers.DecoderLayer, stack,
          {"x": x, "memory": memory, "self_attention_mask": causal,
           "cross_attention_mask": memory_mask}, out),
      "Decoder": (
          layers.Decoder, dict(num_layers=2, **stack),
          {"x": x, "memory": memory, "target_padding_mask": _padding(LENGTH),
           "memory_padding_mask": _padding(MEMORY_LENGTH)}, out),
  }


CASES = _cases()
# Pre-norm ResidualNorm's call is x + Dropout(y): its LayerNorm runs in
# `normalize_input`, before the sub-layer, so the call has no gradient.
NO_WEIGHTS_IN_CALL = {"ResidualNorm-pre"}


def _call(layer, inputs):
  return layer(**inputs) if isinstance(inputs, dict) else layer(inputs)


def _shapes(outputs):
  return keras.tree.map_structure(lambda t: tuple(t.shape), outputs)


def _is_float(dtype):
  return keras.backend.is_float_dtype(keras.backend.standardize_dtype(dtype))


def _config_json(layer):
  return json.dumps(layer.get_config(), sort_keys=True)


@pytest.mark.parametrize("name", CASES)
def test_config_and_serialization_round_trips(name):
  """From its config and through Keras' serialization the layer comes back
  the same, and with the weights set, computes the same."""
  cls, kwargs, inputs, _ = CASES[name]
  layer = cls(**kwargs)
  assert _config_json(cls.from_config(layer.get_config())) == (
      _config_json(layer))
  serialized = json.dumps(keras.saving.serialize_keras_object(layer))
  revived = keras.saving.deserialize_keras_object(json.loads(serialized))
  assert type(revived) is cls
  assert _config_json(revived) == _config_json(layer)
  outputs = _call(layer, inputs)
  _call(revived, inputs)
  revived.set_weights(layer.get_weights())
  # The same computation twice: each within its float32 bound (rounding.py).
  _assert_within_rounding(layer, inputs, _call(revived, inputs), outputs)


def _flat(outputs):
  """A layer's outputs as [batch, K] (flattened, concatenated)."""
  return np.concatenate([
      np.asarray(keras.ops.convert_to_numpy(t), np.float64).reshape(
          len(keras.ops.convert_to_numpy(t)), -1)
      for t in keras.tree.flatten(outputs)], 1)


def _assert_within_rounding(layer, inputs, got, want):
  """Two computations of `layer`'s call on `inputs`, each within its
  float32 bound (rounding.py) of the exact outputs."""
  _, bound = rounding.layer_bounds(layer, inputs)
  rounding.assert_within(_flat(got), _flat(want), 2 * bound,
                         type(layer).__name__)


def _weight_shapes(layer):
  return sorted((w.path.split("/", 1)[-1], tuple(w.shape))
                for w in layer.weights)


@pytest.mark.parametrize("name", CASES)
def test_build_with_keras_3_shape_names_makes_the_call_weights(name):
  cls, kwargs, inputs, _ = CASES[name]
  built = cls(**kwargs)
  if isinstance(inputs, dict):
    built.build(**{k + "_shape": v.shape for k, v in inputs.items()})
  else:
    built.build(inputs.shape)
  assert built.built
  called = cls(**kwargs)
  _call(called, inputs)
  assert _weight_shapes(built) == _weight_shapes(called)
  # A built layer runs without building again.
  assert _shapes(_call(built, inputs)) == _shapes(_call(called, inputs))


@pytest.mark.parametrize("name", CASES)
def test_symbolic_call_matches_eager(name):
  cls, kwargs, inputs, expected_shapes = CASES[name]
  symbolic_inputs = keras.tree.map_structure(
      lambda a: keras.KerasTensor(a.shape, a.dtype), inputs)
  symbolic = _call(cls(**kwargs), symbolic_inputs)
  eager = _call(cls(**kwargs), inputs)
  assert _shapes(symbolic) == _shapes(eager) == expected_shapes
  dtypes = lambda outputs: [keras.backend.standardize_dtype(t.dtype)
                            for t in keras.tree.flatten(outputs)]
  assert dtypes(symbolic) == dtypes(eager)
  assert dtypes(eager)[0] == "float32"


def _compiled_call(layer, inputs):
  """The layer's call compiled as its backend does it (XLA under
  TensorFlow and JAX)."""
  backend = keras.backend.backend()
  if backend == "tensorflow":
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    return tf.function(lambda: _call(layer, inputs), jit_compile=True)()
  if backend == "jax":
    import jax  # pylint: disable=g-import-not-at-top
    def stateless(trainable, non_trainable, inputs):
      args = ((), inputs) if isinstance(inputs, dict) else ((inputs,), {})
      return layer.stateless_call(trainable, non_trainable, *args[0],
                                  **args[1])[0]
    values = lambda variables: [v.value for v in variables]
    return jax.jit(stateless)(values(layer.trainable_variables),
                              values(layer.non_trainable_variables), inputs)
  if backend == "torch":
    import torch  # pylint: disable=g-import-not-at-top
    # No XLA: torch.compile's graph capture and AOT autograd, as Keras'
    # `jit_compile` runs them (graph breaks allowed: Keras' `__call__`
    # has some), short of inductor's C++ code generation.
    tensors = keras.tree.map_structure(
        lambda x: x if x is None else keras.ops.convert_to_tensor(x), inputs)
    return torch.compile(lambda tensors: _call(layer, tensors),
                         backend="aot_eager")(tensors)
  raise NotImplementedError(f"no compiled call for the {backend} backend")


# Keras' compiled fit under torch is torch.compile with inductor, over a
# minute to trace and generate C++ for a step on a CPU: the torch run fits
# eagerly here (the model's compiled step: docs/model.md, "Backends").
FIT_JIT_COMPILE = keras.backend.backend() != "torch"


class LayerModel(keras.Model):
  """keras-hub's TestModel: the layer called on the inputs, by name."""

  def __init__(self, layer):
    super().__init__()
    self.layer = layer

  def call(self, inputs):
    return _call(self.layer, inputs)


@pytest.mark.slow  # XLA compiles each layer's call and fit step
@pytest.mark.parametrize("name", CASES)
def test_jit_compiled_call_and_fit_step(name):
  """The compiled call gives the eager outputs; a layer with weights
  trains one `model.fit` step (compiled with XLA but under torch)."""
  cls, kwargs, inputs, _ = CASES[name]
  layer = cls(**kwargs)
  eager = _call(layer, inputs)
  compiled = _compiled_call(layer, inputs)
  # Two paths (XLA's kernels, the backend's eager ones), each within its
  # float32 bound (rounding.py).
  _assert_within_rounding(layer, inputs, compiled, eager)
  if not layer.trainable_weights or name in NO_WEIGHTS_IN_CALL:
    return
  model = LayerModel(layer)
  model.compile(optimizer="sgd", loss="mse", jit_compile=FIT_JIT_COMPILE)
  before = [w.numpy() for w in layer.trainable_weights]
  # Targets away from the outputs, so that the step has a gradient.
  targets = keras.tree.map_structure(
      lambda t: keras.ops.convert_to_numpy(t) + 1.0, eager)
  history = model.fit(inputs, targets, batch_size=BATCH, verbose=0)
  assert np.isfinite(history.history["loss"][0])
  after = [w.numpy() for w in layer.trainable_weights]
  assert any(not np.array_equal(a, b) for a, b in zip(before, after))


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", CASES)
def test_own_dtype_policy(name, policy):
  cls, kwargs, inputs, _ = CASES[name]
  policy = keras.DTypePolicy(policy)
  layer = cls(**kwargs, dtype=policy)
  outputs = _call(layer, inputs)
  spec = (layer.compute_output_spec(**inputs) if isinstance(inputs, dict)
          else layer.compute_output_spec(inputs))
  for tensor in keras.tree.flatten(outputs) + keras.tree.flatten(spec):
    if _is_float(tensor.dtype):
      assert keras.backend.standardize_dtype(tensor.dtype) == (
          policy.compute_dtype), name
  for weight in layer.weights:
    assert weight.dtype == policy.variable_dtype, weight.path
  for sublayer in layer._flatten_layers():  # pylint: disable=protected-access
    assert (sublayer.compute_dtype, sublayer.variable_dtype) == (
        policy.compute_dtype, policy.variable_dtype), sublayer.path
  for tensor in keras.tree.flatten(outputs):
    assert np.all(np.isfinite(keras.ops.convert_to_numpy(
        keras.ops.cast(tensor, "float32"))))


def _v0_1(run, model, ids, index):
  """layers_v0_1.keras's graph, by the layers' references: embedding,
  positions, the encoder over the padding mask, self-attention, its
  residual sum, the feed-forward network."""
  del index  # each row's ids are all it reads
  by_class = {type(layer).__name__: layer for layer in model.layers}
  real = ids != 0
  x = rounding.layer_call(run, by_class["SharedEmbedding"], x=ids)
  x = rounding.layer_call(run, by_class["SinusoidalPositionalEncoding"], x=x)
  memory = rounding.layer_call(run, by_class["Encoder"], x=x,
                               padding_mask=real)
  attended = rounding.layer_call(run, by_class["MultiHeadAttention"],
                                 query=memory,
                                 attention_mask=real[:, None, None, :])
  out = rounding.layer_call(run, by_class["PositionwiseFeedForward"],
                            x=run.store(memory + attended))
  return rounding.flat(out)


def test_a_keras_file_saved_by_release_0_1_loads_and_computes_the_same():
  """tests/data/layers_v0_1.keras was saved by release 0.1.0, whose
  `MultiHeadAttention` and `PositionwiseFeedForward` configs held the
  switches `fused_attention`, `xla_attention` and `pad_inner`: it loads, and gives
  the outputs it gave then (layers_v0_1.npz) to float32 rounding."""
  data = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
  model = keras.saving.load_model(os.path.join(data, "layers_v0_1.keras"))
  saved = np.load(os.path.join(data, "layers_v0_1.npz"))
  # Computed then on another host's kernels, and now: each within its
  # float32 bound (rounding.py) of the exact outputs.
  _, bound = rounding.custom_bounds(model, [saved["inputs"]], _v0_1,
                                    size=saved["inputs"].shape[1] ** 2)
  rounding.assert_within(_flat(model(saved["inputs"])),
                         _flat(saved["outputs"]), 2 * bound)
  for layer in model.layers:
    assert not {"fused", "fused_attention", "pad_inner", "xla_attention"} & set(
        layer.get_config()), layer.name
