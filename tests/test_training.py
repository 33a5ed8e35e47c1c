"""Section 5's recipe and the training loop: schedule, distribution,
accumulation, determinism, NaN stop, checkpoints and averaging."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_transformer import build_model, get_config
from tf_transformer.training import checkpoints
from tf_transformer.training import schedule
from tf_transformer.training import trainer as trainer_lib
import rounding
from training_helpers import MECHANICS, PRODUCT_DEFAULTS, copy_weights
from training_helpers import distribute, global_batch, make_trainer

# Eq. 3 in float32: d_model^-0.5 and warmup^-1.5 (powers in float64, then
# rounded: one u each), rsqrt (FUNCTION u), the products and the minimum:
# within (FUNCTION + 5) u of itself.
SCHEDULE_RTOL = (rounding.FUNCTION + 5) * rounding.U32


@pytest.mark.numeric
def test_schedule_is_equation_3():
  d_model, warmup = 512, 4000
  for step in (1, 10, 100, 3999, 4000, 4001, 10000, 100000):
    expected = d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
    np.testing.assert_allclose(
        schedule.learning_rate(step, d_model, warmup), expected,
        rtol=SCHEDULE_RTOL)
  assert float(schedule.learning_rate(0, d_model, warmup)) == 0.0
  peak = schedule.learning_rate(4000, 512, 4000)
  assert peak > schedule.learning_rate(3000, 512, 4000)
  assert peak > schedule.learning_rate(5000, 512, 4000)
  # Keras passes completed updates: update n gets eq. 3 at step n.
  keras_schedule = schedule.TransformerSchedule(512, 4000)
  np.testing.assert_allclose(keras_schedule(tf.constant(9)),
                             schedule.learning_rate(10, 512, 4000),
                             rtol=2 * SCHEDULE_RTOL)


def test_optimizer_is_the_papers_adam(tmp_path):
  trainer = make_trainer(tmp_path)
  optimizer = trainer.optimizer
  assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (
      0.9, 0.98, 1e-9)


@pytest.mark.numeric
def test_the_fused_adam_update_is_keras_adam_on_the_summed_gradient():
  """Three updates by our Adam (one ResourceApplyAdam a variable) leave
  the weights and slots that Keras' Adam leaves, to float32 rounding, given
  the same gradients dense. An embedding's gradient (IndexedSlices) is
  summed over repeated rows first, as section 5.3's Adam squares the
  gradient: Keras' own update squares each slice before the sum."""
  from tf_transformer.training.optimizer import Adam  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  start = [rng.normal(size=(5, 3)), rng.normal(size=3)]
  gradients = [[tf.IndexedSlices(tf.constant(rng.normal(size=(2, 3)),
                                             tf.float32), [1, 1 + step],
                                 tf.constant([5, 3])),
                tf.constant(rng.normal(size=3), tf.float32)]
               for step in range(3)]
  dense = [[tf.convert_to_tensor(g) for g in step] for step in gradients]
  results = []
  for adam, given in (
      (Adam(1e-2, beta_1=0.9, beta_2=0.98, epsilon=1e-9), gradients),
      (keras.optimizers.Adam(1e-2, beta_1=0.9, beta_2=0.98, epsilon=1e-9),
       dense)):
    weights = [keras.Variable(w, dtype="float32") for w in start]
    for step_gradients in given:
      adam.apply_gradients(zip(step_gradients, weights))
    results.append([w.numpy() for w in weights + adam.variables])
  assert len(results[0]) == 2 + 2 + 4  # weights, step, rate, m and v
  weights, m, v = _adam_bounds(start, dense, 1e-2, 0.9, 0.98, 1e-9)
  # Weights; the step and the rate (exact); each variable's m and v.
  for ours, theirs, bound in zip(results[0], results[1],
                                 weights + [0.0, 0.0, m[0], v[0], m[1], v[1]]):
    rounding.assert_within(ours, theirs, bound)
  assert not np.allclose(results[0][0], start[0])


def _adam_bounds(start, gradients, rate, beta_1, beta_2, epsilon):
  """How far two float32 implementations of Adam (each slot update
  m <- m + (g - m)(1 - b1) or b1 m + (1 - b1) g, likewise v with g^2, and
  w <- w - rate m^ / (sqrt(v^) + eps) by either placement of the bias
  corrections) may leave the weights and slots apart after `gradients`
  (float32 arrays, dense): replayed in float64 with each quantity's error
  carried to first order, every operation one rounding of its result's
  magnitude (FUNCTION for sqrt and the powers), twice (two implementations).
  Returns the bounds ([weights], [m], [v])."""
  u = rounding.U32
  weights = [np.asarray(w, np.float64) for w in start]
  m = [np.zeros_like(w) for w in weights]
  v = [np.zeros_like(w) for w in weights]
  errors = {"w": [np.zeros_like(w) for w in weights],
            "m": [np.zeros_like(w) for w in weights],
            "v": [np.zeros_like(w) for w in weights]}
  for t, step in enumerate(gradients, 1):
    for i, g in enumerate(step):
      g = np.asarray(g, np.float64)
      new_m = beta_1 * m[i] + (1 - beta_1) * g
      new_v = beta_2 * v[i] + (1 - beta_2) * g * g
      errors["m"][i] = beta_1 * errors["m"][i] + 4 * u * (
          np.abs(m[i]) + np.abs(g))
      errors["v"][i] = beta_2 * errors["v"][i] + 5 * u * (
          np.abs(v[i]) + g * g)
      m[i], v[i] = new_m, new_v
      m_hat = m[i] / (1 - beta_1**t)
      root = np.sqrt(v[i] / (1 - beta_2**t))
      update = rate * m_hat / (root + epsilon)
      relative = (errors["m"][i] / np.maximum(np.abs(m[i]), 1e-300)
                  + errors["v"][i] / np.maximum(2 * v[i], 1e-300)
                  + (3 * rounding.FUNCTION + 8) * u)
      weights[i] = weights[i] - update
      errors["w"][i] = errors["w"][i] + np.abs(update) * relative + u * (
          np.abs(weights[i]))
  return tuple([2 * e for e in errors[k]] for k in ("w", "m", "v"))


def _step(trainer, strategy, batch):
  return trainer.steps.compiled(trainer.steps.train_step)(
      distribute(strategy, batch))


@pytest.mark.numeric
@pytest.mark.slow  # eight logical devices' replicas: the file's costliest
def test_eight_devices_equal_one_device(tmp_path):
  batch = global_batch(rows=16)
  one = make_trainer(tmp_path / "one")
  mirrored = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(8)])
  eight = make_trainer(tmp_path / "eight", mirrored)
  copy_weights(one, eight)
  before = one.model.get_weights()
  loss_one = _step(one, one.strategy, batch)
  loss_eight = _step(eight, mirrored, batch)
  _assert_same_step(one, before, loss_one, loss_eight, batch)
  for a, b in zip(one.model.get_weights(), eight.model.get_weights()):
    rounding.assert_within(a, b, _first_update_bound(one, a))
  assert int(eight.optimizer.iterations.numpy()) == 1


def _assert_same_step(trainer, weights, first, second, batch):
  """Two computations of one step's (loss, nll, target tokens, source
  tokens, gradient norm) on `batch` from `weights`: the token counts
  exact; the summed losses each within its float32 bound (rounding.py:
  each token's nll and mean log-probability, its label-smoothed loss a
  combination of them, then summed); the norms finite (the gradient's own
  rounding has no bound here: the update it scales is held to Adam's, see
  `_first_update_bound`)."""
  np.testing.assert_array_equal(first[2:4], second[2:4])
  model = build_model(trainer.config)
  model((batch[0][0][:1], batch[0][1][:1]))
  model.set_weights(weights)
  (source, target_in), target_out = (tuple(t.numpy() for t in batch[0]),
                                     batch[1].numpy())
  real = tf.constant(target_out != 0, tf.float64)
  smoothing = trainer.config.training.label_smoothing
  ids = tf.constant(target_out)

  def outputs(run, model, source, target_in, index):
    log_probs, _ = rounding.model_log_probs(run, model, source, target_in)
    picked = -tf.gather(log_probs, tf.gather(ids, index), batch_dims=2)
    mean = -tf.reduce_mean(log_probs, -1)
    weights = tf.cast(tf.gather(real, index), picked.dtype)
    loss = (1 - smoothing) * picked + smoothing * mean
    return tf.stack([tf.reduce_sum(loss * weights, 1),
                     tf.reduce_sum(picked * weights, 1)], 1)

  values, bound = rounding.bounds(model, source, target_in, outputs)
  tokens = int(real.numpy().sum())
  for column in (0, 1):  # the sums over the batch's rows, and its own
    within = 2 * (bound[:, column].sum() + tokens * rounding.U32 * np.abs(
        values[:, column]).sum())
    rounding.assert_within(first[column], second[column], within)
  assert np.isfinite(first[4]) and np.isfinite(second[4]), (first, second)


def _first_update_bound(trainer, weights):
  """Adam's first update moves each weight by rate * g / (|g| + eps), at
  most the rate, whatever the gradient: two computations are within twice
  the first step's rate (eq. 3) of each other, and the subtraction's
  rounding."""
  config = trainer.config
  rate = float(schedule.learning_rate(
      1, config.model.d_model, config.training.warmup_steps,
      config.training.learning_rate_scale))
  return 2 * rate * (1 + 8 * rounding.U32) + 2 * rounding.U32 * np.abs(
      weights)


@pytest.mark.numeric
@pytest.mark.parametrize("devices", [1, 2])
def test_accumulated_steps_equal_one_larger_step(tmp_path, devices):
  # Collective groups of another size cannot coexist in one process with
  # the 8-device strategy above, so 2 devices reduce through one device.
  strategy = (tf.distribute.OneDeviceStrategy("/cpu:0") if devices == 1 else
              tf.distribute.MirroredStrategy(
                  ["/cpu:0", "/cpu:1"],
                  cross_device_ops=tf.distribute.ReductionToOneDevice()))
  first, second = global_batch(rows=4, seed=1), global_batch(rows=4, seed=2)
  both = tf.nest.map_structure(lambda a, b: tf.concat([a, b], 0), first,
                               second)
  big = make_trainer(tmp_path / "big", strategy)
  accumulated = make_trainer(tmp_path / "acc", strategy,
                             gradient_accumulation_steps=2)
  copy_weights(big, accumulated)
  _step(big, strategy, both)
  steps = accumulated.steps
  accumulate = steps.compiled(steps.accumulate_step)
  accumulate(distribute(strategy, first))
  accumulate(distribute(strategy, second))
  assert int(accumulated.optimizer.iterations.numpy()) == 0
  steps.compiled(steps.apply_step)()
  assert int(accumulated.optimizer.iterations.numpy()) == 1
  for a, b in zip(big.model.get_weights(), accumulated.model.get_weights()):
    rounding.assert_within(a, b, _first_update_bound(big, a))


def test_same_seed_same_losses(tmp_path):
  losses = []
  for run in ("a", "b"):
    trainer = make_trainer(tmp_path / run, overrides="dropout_rate=0.1",
                           train_steps=3, **PRODUCT_DEFAULTS)
    losses.append(trainer.train()["losses"])
  assert len(losses[0]) == 3
  assert losses[0] == losses[1]


def test_nan_stops_and_keeps_the_last_good_checkpoint(tmp_path):
  trainer = make_trainer(tmp_path, train_steps=2, checkpoint_every_steps=1)
  trainer.train()
  good = tf.train.latest_checkpoint(str(tmp_path))
  assert good.endswith("ckpt-2")
  weight = trainer.model.trainable_variables[0]
  restore = trainer.checkpointer.restore

  def restore_then_poison():  # train() resumes from ckpt-2, then NaN appears
    path = restore()
    weight.assign(tf.fill(weight.shape, np.nan))
    return path

  trainer.checkpointer.restore = restore_then_poison
  trainer.config = trainer.config.replace(train_steps=5)
  with pytest.raises(trainer_lib.NonFiniteLossError) as error:
    trainer.train()
  assert "step 3: loss=nan" in str(error.value)
  assert good in str(error.value)
  assert tf.train.latest_checkpoint(str(tmp_path)) == good
  reader = tf.train.load_checkpoint(good)
  for name, _ in tf.train.list_variables(good):
    if name.startswith("model/"):
      assert np.all(np.isfinite(reader.get_tensor(name)))


# The overrides of a run whose loss runs away while finite.
RUNAWAY = f"{MECHANICS},learning_rate_scale=1e3"


def test_runaway_loss_stops_like_a_nan_naming_a_checkpoint_before_it(
    tmp_path):
  """A learning rate scaled by 1e3 drives the loss up tenfold by about step
  65 while it stays finite (gradient norms under 1e3; at 1e6 they overflow
  within 25 steps on some CPUs, and the NaN check stops the run first); the
  run stops instead of checkpointing garbage to the end."""
  trainer = make_trainer(tmp_path, overrides=RUNAWAY,
                         train_steps=200, checkpoint_every_steps=5,
                         keep_checkpoints=200, log_every_steps=50,
                         divergence_window=20)
  with pytest.raises(trainer_lib.LossRiseError) as error:
    trainer.train()
  message = str(error.value)
  assert "the mean loss of the last 20 steps" in message
  assert "times the lowest such mean" in message
  assert "--divergence_factor" in message
  assert trainer.step < 200
  lowest_step = int(message.split(" at step ")[1].split(" ")[0])
  # Saved every 5 steps here: the newest saved no later than the lowest
  # mean is named, and the advice is not to resume from the newest.
  assert f"ckpt-{lowest_step - lowest_step % 5}: delete the newer ones" in (
      message)
  assert isinstance(error.value, trainer_lib.DivergedError)  # exit 3


def test_divergence_check_off_runs_to_the_end(tmp_path):
  trainer = make_trainer(tmp_path, overrides=RUNAWAY,
                         train_steps=100, log_every_steps=50,
                         divergence_factor=0, divergence_window=20)
  losses = trainer.train()["losses"]
  assert len(losses) == 100
  assert np.mean(losses[-20:]) > 10 * min(losses)  # it did run away


def test_restore_brings_back_step_slots_and_input_position(tmp_path):
  trainer = make_trainer(tmp_path, train_steps=3, checkpoint_every_steps=3)
  trainer.train()
  resumed = make_trainer(tmp_path, train_steps=3)
  assert resumed.step == 0
  resumed.checkpointer.restore()
  assert resumed.step == 3
  assert (int(resumed.epoch.numpy()), int(resumed.batch_in_epoch.numpy())) == (
      int(trainer.epoch.numpy()), int(trainer.batch_in_epoch.numpy()))
  pairs = [(a, b) for a, b in zip(trainer.optimizer.variables,
                                   resumed.optimizer.variables)
           if "momentum" in b.path or "velocity" in b.path]
  assert len(pairs) == 2 * len(trainer.model.trainable_variables)
  assert all(np.any(b.numpy() != 0) for _, b in pairs[:4])
  for a, b in pairs:
    np.testing.assert_array_equal(b.numpy(), a.numpy())
  for a, b in zip(trainer.model.get_weights(), resumed.model.get_weights()):
    np.testing.assert_array_equal(a, b)


def test_a_resumed_run_trains_on_the_uninterrupted_runs_batches(tmp_path):
  """Resumed mid-epoch from the token arrays, with no replay: the same
  losses and weights as a run never stopped, across an epoch's end (the
  numbers task makes 9 batches an epoch here)."""
  whole = make_trainer(tmp_path / "whole", train_steps=12)
  losses = whole.train()["losses"]
  first = make_trainer(tmp_path / "cut", train_steps=7,
                       checkpoint_every_steps=7)
  first.train()
  assert int(first.batch_in_epoch.numpy()) == 7
  rest = make_trainer(tmp_path / "cut", train_steps=12)
  result = rest.train()
  assert int(rest.epoch.numpy()) == 1
  assert result["losses"] == losses[7:]
  for a, b in zip(whole.model.get_weights(), rest.model.get_weights()):
    np.testing.assert_array_equal(a, b)


def test_damaged_newest_checkpoint_falls_back(tmp_path, caplog):
  trainer = make_trainer(tmp_path, train_steps=2, checkpoint_every_steps=1)
  trainer.train()
  newest = tf.train.latest_checkpoint(str(tmp_path))
  for data in tf.io.gfile.glob(newest + ".data-*"):
    with open(data, "r+b") as f:
      f.truncate(16)
  resumed = make_trainer(tmp_path, train_steps=2, checkpoint_every_steps=1)
  path = resumed.checkpointer.restore()
  assert path.endswith("ckpt-1")
  assert resumed.step == 1
  assert any("damaged" in r.getMessage() for r in caplog.records)


def _save_model_checkpoint(model, directory, step):
  manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model),
                                       str(directory), max_to_keep=10)
  return manager.save(checkpoint_number=step)


def test_checkpoint_holds_every_model_weight(tmp_path):
  """Keras 3 hides list attributes from tf.train.Checkpoint; every layer of
  the stacks must still be saved."""
  model = build_model(get_config("tiny", "norm_position=pre"))
  path = tf.train.Checkpoint(model=model).write(str(tmp_path / "ckpt"))
  saved = [n for n, _ in tf.train.list_variables(path) if n.startswith("model/")]
  assert len(saved) == len(model.weights)
  restored = build_model(get_config("tiny", "norm_position=pre"))
  tf.train.Checkpoint(model=restored).read(path).assert_existing_objects_matched()
  for a, b in zip(model.get_weights(), restored.get_weights()):
    np.testing.assert_array_equal(a, b)


def test_average_of_two_checkpoints_is_the_mean(tmp_path):
  config = get_config("tiny")
  model = build_model(config)
  first = [w.copy() for w in model.get_weights()]
  _save_model_checkpoint(model, tmp_path / "run", 1)
  second = [w + np.float32(1.5) for w in first]
  model.set_weights(second)
  _save_model_checkpoint(model, tmp_path / "run", 2)
  averaged = build_model(config)
  path, chosen = checkpoints.average_checkpoints(
      averaged, str(tmp_path / "run"), 2, str(tmp_path / "avg"))
  assert len(chosen) == 2 and path.endswith("ckpt-2")
  restored = build_model(config)
  tf.train.Checkpoint(model=restored).read(path).expect_partial()
  # The mean of two float32 numbers: a sum and a halving (exact), one
  # rounding each, here and in NumPy.
  for a, b, r in zip(first, second, restored.get_weights()):
    rounding.assert_within(r, (a + b) / 2, 2 * rounding.U32 * np.abs(
        (a.astype(np.float64) + b) / 2))


@pytest.mark.numeric
def test_average_up_to_a_step_skips_the_later_checkpoints(tmp_path):
  config = get_config("tiny")
  model = build_model(config)
  first = [w.copy() for w in model.get_weights()]
  for step in (1, 2, 3):
    model.set_weights([w + np.float32(step) for w in first])
    _save_model_checkpoint(model, tmp_path / "run", step)
  averaged = build_model(config)
  path, chosen = checkpoints.average_checkpoints(
      averaged, str(tmp_path / "run"), 2, str(tmp_path / "avg"), last_step=2)
  assert [checkpoints.step_of(p) for p in chosen] == [1, 2]
  assert path.endswith("ckpt-2")
  # (a + 1 + a + 2) / 2 against a + 1.5: a few roundings of the sum's
  # magnitude (the two adds, the sum, the halving; NumPy's add).
  for a, r in zip(first, averaged.get_weights()):
    rounding.assert_within(r, a + np.float32(1.5), 6 * rounding.U32 * (
        np.abs(a.astype(np.float64)) + 2))
  with pytest.raises(checkpoints.CheckpointError, match=r"has 1 checkpoint"
                     r"\(s\) at or before step 1, fewer than "
                     "--num_checkpoints=2"):
    checkpoints.average_checkpoints(averaged, str(tmp_path / "run"), 2,
                                    str(tmp_path / "avg2"), last_step=1)


def test_averaging_identical_checkpoints_is_the_identity(tmp_path):
  config = get_config("tiny")
  model = build_model(config)
  for step in (1, 2, 3):
    _save_model_checkpoint(model, tmp_path / "run", step)
  averaged = build_model(config)
  path, _ = checkpoints.average_checkpoints(averaged, str(tmp_path / "run"), 3,
                                            str(tmp_path / "avg"))
  for a, b in zip(model.get_weights(), averaged.get_weights()):
    np.testing.assert_array_equal(a, b)
  with pytest.raises(checkpoints.CheckpointError, match="has 3 checkpoint"
                     r"\(s\), fewer than --num_checkpoints=4"):
    checkpoints.average_checkpoints(averaged, str(tmp_path / "run"), 4,
                                    str(tmp_path / "avg2"))


def test_averaging_skips_optimizer_slots_and_step(tmp_path):
  trainer = make_trainer(tmp_path / "run", train_steps=2,
                         checkpoint_every_steps=1)
  trainer.train()
  model = build_model(trainer.config)
  path, _ = checkpoints.average_checkpoints(model, str(tmp_path / "run"), 2,
                                            str(tmp_path / "avg"))
  names = [n for n, _ in tf.train.list_variables(path)]
  assert any(n.startswith("model/") for n in names)
  assert not any(n.startswith("optimizer/") for n in names)


@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
def test_mixed_precision_trains(tmp_path, precision):
  trainer = make_trainer(tmp_path, mixed_precision=precision, train_steps=3)
  assert trainer.model.compute_dtype == precision
  assert trainer.model.weights[0].dtype == "float32"
  if precision == "float16":
    assert isinstance(trainer.optimizer, keras.optimizers.LossScaleOptimizer)
  losses = trainer.train()["losses"]
  assert len(losses) == 3 and all(np.isfinite(losses))


def test_a_step_due_for_both_saves_before_it_evaluates(tmp_path):
  trainer = make_trainer(tmp_path, train_steps=4, checkpoint_every_steps=2,
                         eval_every_steps=2)
  seen = []
  trainer.evaluate = lambda step: seen.append(
      (step, tf.train.latest_checkpoint(str(tmp_path)))) or {}
  trainer.train()
  assert [(step, path.rsplit("/", 1)[-1]) for step, path in seen] == [
      (2, "ckpt-2"), (4, "ckpt-4")]


def test_stray_files_of_a_killed_save_are_removed(tmp_path, caplog):
  (tmp_path / "ckpt-7_temp").mkdir()
  (tmp_path / "ckpt-7_temp" / "part-00000-of-00001.index").write_text("x")
  for name in ("checkpoint.tmp0123abcd", "config.json.tmp", "notes_temp",
               "my.tmp.txt"):
    (tmp_path / name).write_text("x")
  caplog.set_level("INFO")
  make_trainer(tmp_path, train_steps=2).train()
  for name in ("ckpt-7_temp", "checkpoint.tmp0123abcd", "config.json.tmp"):
    assert not (tmp_path / name).exists()
    assert any(f"removed {tmp_path / name}" in r.getMessage()
               for r in caplog.records)
  assert (tmp_path / "notes_temp").exists()  # not ours: kept
  assert (tmp_path / "my.tmp.txt").exists()
  assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-2")


class _StopAfter:
  """A StopRequest that is requested once the trainer reaches `step`."""

  def __init__(self, trainer, step):
    self.trainer, self.step = trainer, step
    self.signal_name = "SIGTERM"

  @property
  def requested(self):
    return self.trainer.step >= self.step


def test_a_stop_request_saves_at_the_step_boundary(tmp_path):
  trainer = make_trainer(tmp_path, train_steps=10, checkpoint_every_steps=100,
                         eval_every_steps=3)
  evaluated = []
  trainer.evaluate = lambda step: evaluated.append(step) or {}
  result = trainer.train(_StopAfter(trainer, 3))
  assert result["step"] == 3 and result["stopped_by"] == "SIGTERM"
  assert result["checkpoint"].endswith("ckpt-3")
  assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-3")
  assert evaluated == []  # stopping skips the evaluation that was due


class _Clock:
  """time.time for the trainer: each training step takes 30 seconds."""

  def __init__(self):
    self.now = 1000.0

  def time(self):
    return self.now


def _timed(trainer, clock):
  step = trainer.train_one_step

  def slow_step():
    clock.now += 30.0
    return step()
  trainer.train_one_step = slow_step
  return trainer


def test_train_minutes_stop_with_a_checkpoint_counted_over_resumes(
    tmp_path, monkeypatch):
  clock = _Clock()
  monkeypatch.setattr(trainer_lib, "time", clock)
  first = _timed(make_trainer(tmp_path, train_steps=10, train_minutes=1.5,
                              checkpoint_every_steps=100), clock)
  result = first.train()
  assert result["step"] == 3 and result["time_up"]
  assert result["train_minutes"] == pytest.approx(1.5)
  assert result["checkpoint"].endswith("ckpt-3")
  # The same budget again: already used up, nothing trained.
  again = make_trainer(tmp_path, train_steps=10, train_minutes=1.5)
  result = _timed(again, clock).train()
  assert result["step"] == 3 and result["time_up"] and not result["losses"]
  # A larger budget continues from the minutes already spent.
  more = make_trainer(tmp_path, train_steps=10, train_minutes=3)
  result = _timed(more, clock).train()
  assert result["step"] == 6 and len(result["losses"]) == 3
  assert result["train_minutes"] == pytest.approx(3.0)
  # train_steps still bounds it.
  bounded = make_trainer(tmp_path, train_steps=7, train_minutes=60)
  result = _timed(bounded, clock).train()
  assert result["step"] == 7 and not result["time_up"]


def test_a_checkpoint_without_train_seconds_still_restores(tmp_path):
  """Checkpoints written before the time budget existed resume."""
  trainer = make_trainer(tmp_path, train_steps=2)
  trainer.train()
  old_dir = tmp_path / "old"
  old = tf.train.Checkpoint(model=trainer.model, optimizer=trainer.optimizer,
                            epoch=trainer.epoch,
                            batch_in_epoch=trainer.batch_in_epoch)
  tf.train.CheckpointManager(old, str(old_dir), 1).save(checkpoint_number=2)
  resumed = make_trainer(old_dir, train_steps=2)
  assert resumed.checkpointer.restore().endswith("ckpt-2")
  assert resumed.step == 2
  assert float(resumed.train_seconds.numpy()) == 0.0
