"""The training loop of section 5 under any tf.distribute strategy.

One optimizer update per step, by the replicas' step functions of
`steps.DistributedSteps` (the objective normalized over the whole global
batch, gradient accumulation).

Nothing is lost: checkpoints hold the model, the optimizer (slots, step) and
the input position (epoch, batches read in it); each epoch's order is fixed by
the seed, so a resumed run reads exactly the batches it had not read. A step
that evaluates saves first, so a kill during evaluation loses nothing and
the best checkpoint by dev BLEU (or loss) can be kept apart (`best`), which
also stops a run early when dev stops improving; a checkpoint is written only when every weight and
optimizer slot is finite; a loss that runs away while finite stops the run
as a NaN does (`divergence`); a `StopRequest` (SIGTERM, Ctrl-C) saves at the
next step boundary and returns.
"""

import dataclasses
import math
import os
import time
from typing import Optional

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from tf_transformer.data import batching
from tf_transformer.data import epoch_batches
from tf_transformer.data import errors
from tf_transformer.data import sources
from tf_transformer.data import token_store
from tf_transformer.decoding.search import DecodingOptions
from tf_transformer.model import build_model
from tf_transformer.training import optimizer as optimizer_lib
from tf_transformer.training import schedule
from tf_transformer.training import strategy as strategy_lib
from tf_transformer.training.best import BEST_DIR
from tf_transformer.training.best import DevRecord
from tf_transformer.training.best import default_metric
from tf_transformer.training.checkpoints import RUN_FILES
from tf_transformer.training.checkpoints import Checkpointer
from tf_transformer.training.checkpoints import checkpoint_paths
from tf_transformer.training.checkpoints import step_of
from tf_transformer.training.divergence import DivergenceMonitor
from tf_transformer.training.evaluator import Evaluator
from tf_transformer.training.steps import DistributedSteps
from tf_transformer.training.summaries import Summaries


class DivergedError(RuntimeError):
  """Training went wrong in a way that more steps cannot mend; the run
  stops (bin/train.py: exit 3) naming the checkpoint to go back to."""


class NonFiniteLossError(DivergedError):
  """The loss, the gradients or the weights became NaN or Inf."""


class LossRiseError(DivergedError):
  """The loss stayed finite but far above its lowest (`divergence`)."""


RECOVERY_ADVICE = (
    "lower the learning rate and resume with the same weights "
    "(--allow_recipe_change --hparams=learning_rate_scale=0.5), start again "
    "in a new --model_dir, or check the data")


@dataclasses.dataclass
class TrainOptions:
  """How to run training (the recipe, with train_steps and batch_tokens,
  is `config.training`)."""
  model_dir: str
  max_length: int = 256
  gradient_accumulation_steps: int = 1
  checkpoint_every_steps: Optional[int] = None
  checkpoint_every_secs: Optional[int] = 600
  keep_checkpoints: int = 20
  eval_every_steps: int = 1000
  eval_max_sentences: int = 0  # 0: the whole dev set
  eval_decoding: str = "greedy"  # or "beam": the config's beam search
  # What MODEL_DIR/best/ keeps: "bleu", "exact_match" or "loss"; None:
  # the dataset's (`best.default_metric`).
  best_metric: Optional[str] = None
  early_stopping: int = 0  # evaluations without improvement; 0: never
  early_stopping_min_delta: float = 0.0
  log_every_steps: int = 100
  seed: int = 0
  xla_loss: bool = True  # the loss and its gradient under XLA (training.loss)
  # The attention core and its gradient under XLA in the training step
  # (`layers.attention.xla_compiled`); None: `xla_attention_default()`.
  xla_attention: Optional[bool] = None
  mixed_precision: Optional[str] = None
  log_gradient_norm: bool = True
  # A time budget: stop (with a checkpoint) once the run has trained this
  # long, counted over resumes; train_steps still bounds it.
  train_minutes: Optional[float] = None
  # Stop when the mean loss of the last `divergence_window` steps exceeds
  # `divergence_factor` times the lowest such mean so far (0: never).
  divergence_factor: float = 10.0
  divergence_window: int = 100
  # A checkpoint whose model weights start a new run (fine-tuning): the
  # optimizer, step and schedule start afresh; ignored once the run has a
  # checkpoint of its own.
  init_from: Optional[str] = None


def xla_attention_default():
  """--xla_attention's default: on where TensorFlow sees a GPU, where XLA
  fuses the scores, mask, softmax and weighted sum into one kernel (no run
  of TensorFlow on a GPU has measured it yet: benchmarks/gpu_check.py is
  ready to); off on CPUs, where the compiled core measured no faster
  (docs/performance.md's ideas table)."""
  return bool(tf.config.list_physical_devices("GPU"))


class Trainer:
  """Trains `config` on `spec`'s data, tokenized by `vocabulary`."""

  def __init__(self, config, vocabulary, spec, options: TrainOptions,
               strategy: tf.distribute.Strategy):
    self.config, self.vocabulary, self.spec = config, vocabulary, spec
    if options.xla_attention is None:
      options = dataclasses.replace(options,
                                    xla_attention=xla_attention_default())
    self.options, self.strategy = options, strategy
    self.is_chief = strategy_lib.is_chief(strategy)
    optimizer_lib.set_mixed_precision(options.mixed_precision)
    keras.utils.set_random_seed(options.seed)
    with strategy.scope():
      self.model = build_model(config)
      self.optimizer = optimizer_lib.create_optimizer(
          config, options.mixed_precision)
      self.optimizer.build(self.model.trainable_variables)
    self.steps = DistributedSteps(self.model, self.optimizer, strategy,
                                  config.training.label_smoothing, options)
    self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
    self.batch_in_epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
    self.train_seconds = tf.Variable(0.0, dtype=tf.float64, trainable=False)
    self.checkpointer = Checkpointer(
        options.model_dir, options.keep_checkpoints,
        options.checkpoint_every_steps, options.checkpoint_every_secs,
        self.is_chief, strategy_lib.worker_id(strategy), model=self.model,
        optimizer=self.optimizer, epoch=self.epoch,
        batch_in_epoch=self.batch_in_epoch,
        optional=dict(train_seconds=self.train_seconds))
    self.summaries = Summaries(options.model_dir, enabled=self.is_chief)
    self.last_logged_loss = None  # the last progress line's
    self.evaluator = Evaluator(
        self.model, vocabulary, spec, strategy, self.summaries,
        lambda batch: self.steps.compiled(self.steps.eval_step)(batch),
        batching.distributed_dataset_fn(
            self._token_pairs("dev"), config.training.batch_tokens,
            options.max_length),
        self.is_chief, options.eval_max_sentences,
        DecodingOptions.from_config(config, method=options.eval_decoding),
        config.training.label_smoothing)
    self.dev_record = DevRecord(
        options.model_dir,
        options.best_metric or default_metric(spec.dataset),
        options.early_stopping,
        options.early_stopping_min_delta, RUN_FILES, self.is_chief,
        evaluation={"decoding": options.eval_decoding,
                    "max_sentences": options.eval_max_sentences})
    self._floats = [v for v in self.model.weights + self.optimizer.variables
                    if tf.as_dtype(v.dtype).is_floating]

  @property
  def step(self) -> int:
    return int(self.optimizer.iterations.numpy())

  # ---- data ---------------------------------------------------------------

  def _token_pairs(self, split):
    return lambda: batching.tokenize(
        batching.text_dataset(sources.text_pairs(self.spec, split)),
        self.vocabulary, source_eos=self.config.model.source_eos)

  def _train_iterator(self):
    """Batches over the whole corpus from the training pairs' token arrays
    (written once into the run directory by its chief), from the saved
    input position on, without replaying the batches before it."""
    o = self.options
    if not self.is_chief:
      token_store.wait_for(o.model_dir, self.spec)
    stores = token_store.open_training(o.model_dir, self.spec,
                                       self.vocabulary, self.is_chief)
    dataset_fn = epoch_batches.training_stream_fn(
        stores, self.config.training.batch_tokens, o.max_length,
        seed=o.seed, start_epoch=int(self.epoch.numpy()),
        start_batch=int(self.batch_in_epoch.numpy()),
        source_eos=self.config.model.source_eos, full_rows=o.xla_attention)
    return iter(self.strategy.distribute_datasets_from_function(dataset_fn))

  def _next_batch(self):
    """The next global micro-batch; records the input position after it."""
    batch, (epoch, index) = next(self._iterator)
    local = self.strategy.experimental_local_results
    epoch, index = int(local(epoch)[-1]), int(local(index)[-1])
    self.epoch.assign(epoch)
    self.batch_in_epoch.assign(index + 1)
    return batch

  # ---- steps --------------------------------------------------------------

  def train_one_step(self):
    """One optimizer update; returns (loss, nll, target tokens, source
    tokens, gradient norm) summed over the global batch."""
    return self.steps.update(self._next_batch)

  # ---- evaluation ---------------------------------------------------------

  def evaluate(self, step):
    """Dev loss, BLEU, samples and attention at `step` (`Evaluator`)."""
    return self.evaluator(step)

  # ---- the loop -----------------------------------------------------------

  @errors.unwrapped()  # tf.data wraps the readers' DataErrors
  def train(self, stop=None):
    """Trains to `train_steps`, resuming from the newest checkpoint, or
    until `stop.requested` (an `interruption.StopRequest`): then saves at
    that step boundary and returns with `stopped_by` set."""
    o = self.options
    if self.is_chief:
      self.checkpointer.remove_stray_files()
    restored = self.checkpointer.restore()
    if restored:
      logging.info("resumed from %s at step %d (epoch %d, batch %d)",
                   restored, self.step, int(self.epoch.numpy()),
                   int(self.batch_in_epoch.numpy()))
    self.dev_record.resume(self.step)
    if not restored and o.init_from:
      self._initialize_from(o.init_from)
    stopped_early = self._stopped_early()
    self.summaries.hparams({**self.config.flat(),
                            **dataclasses.asdict(o)})
    self._iterator = self._train_iterator()
    self.steps.element_spec = self._iterator.element_spec[0]
    self._seconds_before = float(self.train_seconds.numpy())
    window = np.zeros(5)
    window_start, window_steps = time.time(), 0
    run_start, start_step = time.time(), self.step
    history = []
    metrics = {}
    divergence = DivergenceMonitor(o.divergence_factor, o.divergence_window)
    stopping = self._stop_agreed(stop)
    time_up = self._time_up(run_start)
    train_steps = self.config.training.train_steps
    while self.step < train_steps and not (stopping or time_up or
                                           stopped_early):
      loss_sum, nll_sum, tokens, source_tokens, norm = self.train_one_step()
      step = self.step
      loss = loss_sum / max(tokens, 1.0)
      if not (math.isfinite(loss) and math.isfinite(norm)):
        raise self._non_finite(step, f"loss={loss} gradient_norm={norm}")
      diverged = divergence.update(step, loss)
      if diverged:
        raise self._loss_rise(step, diverged, divergence.lowest_step)
      history.append(loss)
      window += [loss_sum, nll_sum, tokens, source_tokens, norm]
      window_steps += 1
      if step % o.log_every_steps == 0 or step == train_steps:
        self._log(step, window, window_steps, time.time() - window_start,
                  (time.time() - run_start) / max(step - start_step, 1))
        window, window_start, window_steps = np.zeros(5), time.time(), 0
      stopping = self._stop_agreed(stop)
      time_up = self._time_up(run_start)
      evaluating = bool(o.eval_every_steps) and (
          step % o.eval_every_steps == 0) and not stopping
      if stopping or time_up or evaluating or self.checkpointer.due(step):
        self.save(step)  # before evaluating: a kill there loses nothing
      if evaluating:
        metrics = self.evaluate(step)
        self.dev_record.add(step, metrics, self.checkpointer.latest())
        stopped_early = self._stopped_early()
    if (time_up or stopped_early) and window_steps:  # the last steps' line
      self._log(step, window, window_steps, time.time() - window_start,
                (time.time() - run_start) / max(step - start_step, 1))
    self.save(self.step)
    fingerprint = sum(float(np.sum(np.abs(w))) for w in self.model.get_weights())
    return {"step": self.step, "losses": history, "dev": metrics,
            "last_logged_loss": self.last_logged_loss,
            "weights_fingerprint": fingerprint,
            "stopped_by": (stop and stop.signal_name or
                           "a signal to another worker") if stopping else None,
            "time_up": bool(time_up), "train_minutes": self._minutes(),
            "checkpoint": self.checkpointer.latest(),
            "stopped_early": stopped_early, "best": self._best()}

  def _best(self):
    """The best dev evaluation (step, metrics) and where it is kept."""
    best = self.dev_record.best
    return best and dict(best, directory=os.path.join(self.options.model_dir,
                                                      BEST_DIR))

  def _stopped_early(self):
    """The early-stopping line once dev stopped improving (`best`), agreed
    by all workers (the chief alone has BLEU), else None."""
    reason = self.dev_record.stop_reason()
    if not self._stop_agreed(None, reason is not None):
      return None
    reason = reason or "early stopping: the chief worker's dev scores"
    logging.info("%s; stopping at step %d", reason, self.step)
    return reason

  def _initialize_from(self, checkpoint):
    """Reads the model weights (nothing else) of another run's checkpoint;
    every weight of this model must be in it. With dev evaluations on, the
    starting weights are saved and evaluated as step 0, so that the best
    checkpoint is the starting point where fine-tuning never beats it."""
    tf.train.Checkpoint(model=self.model).read(checkpoint).expect_partial(
        ).assert_existing_objects_matched()
    logging.info("initialized the model weights from %s; the optimizer, "
                 "step and learning rate schedule start afresh", checkpoint)
    if self.options.eval_every_steps:
      self.checkpointer.save(0)
      self.dev_record.add(0, self.evaluate(0), self.checkpointer.latest())

  def _minutes(self):
    return float(self.train_seconds.numpy()) / 60

  def _time_up(self, run_start):
    """Counts this run's time into `train_seconds` (saved with checkpoints);
    whether --train_minutes are used up (agreed by all workers)."""
    self.train_seconds.assign(self._seconds_before + time.time() - run_start)
    budget = self.options.train_minutes
    return bool(budget) and self._stop_agreed(
        None, self.train_seconds.numpy() >= budget * 60)

  def save(self, step):
    """Checkpoints `step` unless it is saved already or the weights or
    optimizer slots hold a NaN or Inf (then raises: never saved)."""
    if step == 0 or step == self.checkpointer.last_save_step:
      return
    if not self._all_finite():
      raise self._non_finite(step, "the update made weights or optimizer "
                             "slots non-finite (not saved)")
    self.checkpointer.save(step)

  def _all_finite(self):
    """Whether every weight and optimizer slot is finite. Eager: run once
    a save, it costs less than tracing it as a function of a few hundred
    ops."""
    return bool(tf.reduce_all([tf.reduce_all(tf.math.is_finite(v))
                               for v in self._floats]))

  def _non_finite(self, step, what):
    latest = self.checkpointer.latest()
    where = (f"The last good checkpoint is {latest} (a restart resumes from "
             "it)" if latest else "No checkpoint was saved yet")
    return NonFiniteLossError(f"step {step}: {what}; stopping. {where}; "
                              + RECOVERY_ADVICE)

  def _loss_rise(self, step, what, lowest_step):
    """The error for a run that diverged after `lowest_step`, naming the
    newest checkpoint saved no later than that step."""
    before = [path for path in checkpoint_paths(self.options.model_dir)
              if step_of(path) <= lowest_step]
    # Unlike a NaN, the rise reached the newer checkpoints: a plain resume
    # would restore its weights.
    where = (f"The last checkpoint from before the rise is {before[-1]}: "
             "delete the newer ones and resume with a lower learning rate "
             "(--allow_recipe_change --hparams=learning_rate_scale=0.5)"
             if before else "No checkpoint was saved before the rise: start "
             "again in a new --model_dir with a lower learning rate "
             "(--hparams=learning_rate_scale=0.5)")
    return LossRiseError(f"step {step}: {what}; stopping. {where}, or check "
                         "the data")

  def _stop_agreed(self, stop, requested=False):
    """Whether to stop now; under MultiWorkerMirroredStrategy, whether any
    worker was asked to (all must save the same step together)."""
    requested = requested or (stop is not None and stop.requested)
    if not isinstance(self.strategy,
                      tf.distribute.MultiWorkerMirroredStrategy):
      return requested
    return float(self._over_workers(float(requested))) > 0

  def _over_workers(self, value):
    """The sum over workers of `value` (floats)."""
    return self.steps.compiled(self.steps.any_worker)(tf.constant(value))

  def _log(self, step, window, steps, seconds, seconds_per_step):
    loss_sum, nll_sum, tokens, source_tokens, norm = window
    loss = loss_sum / max(tokens, 1.0)
    # The rate the logged update used (the optimizer already points at the
    # next one).
    learning_rate = float(schedule.for_config(self.config)(
        step - 1))
    tokens_per_sec = (tokens + source_tokens) / max(seconds, 1e-9)
    self.last_logged_loss = loss
    train_steps = self.config.training.train_steps
    eta = seconds_per_step * (train_steps - step)
    if self.options.train_minutes:
      eta = min(eta, self.options.train_minutes * 60 - self._minutes() * 60)
    eta = max(int(eta), 0)
    logging.info(
        "step %d/%d loss %.4f lr %.3g tokens/s %s ETA %d:%02d:%02d epoch %d",
        step, train_steps, loss, learning_rate,
        f"{tokens_per_sec:,.0f}", eta // 3600, eta // 60 % 60, eta % 60,
        int(self.epoch.numpy()))
    self.summaries.scalars("train", step, {
        "loss": loss, "perplexity": math.exp(min(nll_sum / max(tokens, 1), 50)),
        "learning_rate": learning_rate, "tokens_per_sec": tokens_per_sec,
        "gradient_norm": norm / max(steps, 1)})
