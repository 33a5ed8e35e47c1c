"""The step functions of section 5's training under a tf.distribute strategy:
an optimizer update, a micro-batch's gradients accumulated and then
applied, a dev batch's loss; each run on every replica and reduced.

The objective is the summed label-smoothed loss (section 5.4) divided by
the number of target tokens in the whole global batch (all replicas, all
accumulated micro-batches), so the update is the same whatever the number
of devices or accumulation steps (tested). Gradient accumulation keeps
per-replica sums in ON_READ variables and applies once per step, as
OpenNMT-tf does; Keras' own `gradient_accumulation_steps` averages
per-batch means instead, which weights short batches too much.
"""

import inspect

import keras
import numpy as np
import tensorflow as tf

from tf_transformer.data import pipeline_options
from tf_transformer.layers import attention
from tf_transformer.special_ids import PAD_ID
from tf_transformer.training.loss import token_losses

SUM = tf.distribute.ReduceOp.SUM
MEAN = tf.distribute.ReduceOp.MEAN


class DistributedSteps:
  """`model`'s training and evaluation steps on `strategy`'s replicas.

  Args:
    model: the `Transformer`, built in `strategy.scope()`.
    optimizer: its optimizer (a `LossScaleOptimizer` under float16), built.
    strategy: the tf.distribute strategy.
    label_smoothing: epsilon_ls (section 5.4).
    options: the run's `TrainOptions` (gradient_accumulation_steps,
      xla_loss, xla_attention, log_gradient_norm).
  """

  def __init__(self, model, optimizer, strategy, label_smoothing, options):
    self.model, self.optimizer, self.strategy = model, optimizer, strategy
    self.label_smoothing, self.options = label_smoothing, options
    self.accumulation = options.gradient_accumulation_steps
    if self.accumulation > 1:
      on_read = dict(trainable=False,
                     synchronization=tf.VariableSynchronization.ON_READ,
                     aggregation=tf.VariableAggregation.SUM)
      with strategy.scope():
        self.accumulated = [tf.Variable(tf.zeros_like(v), **on_read)
                            for v in model.trainable_variables]
        self.accumulated_tokens = tf.Variable(0.0, **on_read)
    # The training batches' element spec, once the trainer has opened them:
    # the steps taking a batch then trace once whatever the bucket shapes.
    self.element_spec = None
    self._functions = {}

  # ---- on one replica -----------------------------------------------------

  def _forward(self, batch, training):
    (source, target_in), target_out = batch
    with attention.xla_compiled(training and self.options.xla_attention):
      logits = self.model((source, target_in), training=training)
    losses, nll, weights = token_losses(target_out, logits,
                                        self.label_smoothing,
                                        jit_compile=self.options.xla_loss)
    source_tokens = tf.reduce_sum(tf.cast(source != PAD_ID, tf.float32))
    return (tf.reduce_sum(losses), tf.reduce_sum(nll), tf.reduce_sum(weights),
            source_tokens)

  def _scale(self, loss):
    if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
      return self.optimizer.scale_loss(loss)
    return loss

  def _apply(self, gradients):
    """Applies this replica's share of the update; returns the global norm
    of the aggregated (unscaled) gradient."""
    variables = self.model.trainable_variables
    context = tf.distribute.get_replica_context()
    replicas = context.num_replicas_in_sync
    if self.options.log_gradient_norm and replicas > 1:
      # Keras sums gradients over replicas; sum them here first to measure
      # the norm of the real update, and hand Keras 1/replicas of it.
      gradients = context.all_reduce(SUM, gradients)
      norm = tf.linalg.global_norm(gradients)
      gradients = [g / replicas for g in gradients]
    else:
      norm = tf.linalg.global_norm(gradients)  # local: NaN check only
    if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
      norm /= tf.cast(self.optimizer.dynamic_scale, norm.dtype)
    self.optimizer.apply_gradients(zip(gradients, variables))
    return norm

  def _train_replica_step(self, batch):
    """One replica's share of an update: (loss, nll, target tokens, source
    tokens) summed over its batch, and the gradient norm."""
    context = tf.distribute.get_replica_context()
    with tf.GradientTape() as tape:
      loss_sum, nll_sum, tokens, source_tokens = self._forward(batch, True)
      global_tokens = context.all_reduce(SUM, tokens)
      objective = self._scale(loss_sum / tf.maximum(global_tokens, 1.0))
    gradients = tape.gradient(objective, self.model.trainable_variables)
    norm = self._apply(gradients)
    return loss_sum, nll_sum, tokens, source_tokens, norm

  def _accumulate_replica_step(self, batch):
    """One replica's gradients of a micro-batch, added to `accumulated`."""
    with tf.GradientTape() as tape:
      loss_sum, nll_sum, tokens, source_tokens = self._forward(batch, True)
      objective = self._scale(loss_sum)
    gradients = tape.gradient(objective, self.model.trainable_variables)
    for accumulated, gradient in zip(self.accumulated, gradients):
      accumulated.assign_add(gradient)
    self.accumulated_tokens.assign_add(tokens)
    return loss_sum, nll_sum, tokens, source_tokens

  def _apply_accumulated_replica_step(self):
    context = tf.distribute.get_replica_context()
    global_tokens = tf.maximum(
        context.all_reduce(SUM, self.accumulated_tokens.read_value()), 1.0)
    norm = self._apply([a.read_value() / global_tokens
                        for a in self.accumulated])
    for accumulated in self.accumulated:
      accumulated.assign(tf.zeros_like(accumulated))
    self.accumulated_tokens.assign(0.0)
    return norm

  def _eval_replica_step(self, batch):
    loss_sum, nll_sum, tokens, _ = self._forward(batch, False)
    return loss_sum, nll_sum, tokens

  def _sum(self, values):
    return [self.strategy.reduce(SUM, v, axis=None) for v in values]

  # ---- global: every replica, reduced; called through `compiled` ----------

  def train_step(self, batch):
    """One update on a global batch: (loss, nll, target tokens, source
    tokens) summed over the replicas, the gradient norm averaged."""
    outputs = self.strategy.run(self._train_replica_step,
                                args=(batch,))
    return self._sum(outputs[:4]) + [self.strategy.reduce(
        MEAN, outputs[4], axis=None)]

  def accumulate_step(self, batch):
    """A micro-batch's gradients added up (--gradient_accumulation_steps);
    returns what `train_step` does, without the norm."""
    return self._sum(self.strategy.run(
        self._accumulate_replica_step, args=(batch,)))

  def apply_step(self):
    """The accumulated gradients applied; returns the gradient norm."""
    return self.strategy.reduce(MEAN, self.strategy.run(
        self._apply_accumulated_replica_step), axis=None)

  def eval_step(self, batch):
    """(loss, nll, target tokens) of a dev batch, summed."""
    return self._sum(self.strategy.run(self._eval_replica_step,
                                       args=(batch,)))

  def any_worker(self, flag):
    """The sum over workers of `flag` (a float)."""
    return self.strategy.reduce(
        SUM, self.strategy.run(lambda: tf.identity(flag)), axis=None)

  def compiled(self, step):
    """The tf.function of `step` (one of the global steps above), made at
    its first call and kept. A step taking a batch gets `element_spec`
    (dimensions None) once it is set, so it traces once whatever the bucket
    shapes; before that (a test's fixed batches) it retraces per shape."""
    function = self._functions.get(step.__name__)
    if function is None:
      takes_batch = "batch" in inspect.signature(step).parameters
      signature = ([self.element_spec]
                   if takes_batch and self.element_spec is not None else None)
      function = tf.function(step, input_signature=signature,
                             reduce_retracing=True, autograph=False)
      self._functions[step.__name__] = function
    return function

  def update(self, next_batch):
    """One optimizer update from `next_batch()` (global batches; as many
    as --gradient_accumulation_steps); returns (loss, nll, target tokens,
    source tokens, gradient norm) summed over them."""
    if self.accumulation == 1:
      return [float(v) for v in self.compiled(self.train_step)(next_batch())]
    totals = np.zeros(4)
    accumulate = self.compiled(self.accumulate_step)
    for _ in range(self.accumulation):
      totals += [float(v) for v in accumulate(next_batch())]
    return list(totals) + [float(self.compiled(self.apply_step)())]

  def fixed_batch_step(self, batch):
    """A function that runs one optimizer update on `batch`, ((source,
    target_in), target_out) of the global batch, each call and returns its
    summed loss: a probe's or a benchmark's step, without the input
    pipeline."""
    distributed = next(iter(self.strategy.experimental_distribute_dataset(
        pipeline_options.without_autotuning(
            tf.data.Dataset.from_tensors(batch)))))
    step = self.compiled(self.train_step)
    return lambda: float(step(distributed)[0])
