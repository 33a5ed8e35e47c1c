"""How a command cuts its input lines into batches: sorted by length, so that
little of a batch is padding (OpenNMT-tf's, fairseq's and Marian's batching
of a file), or in input order. Plain Python, so that a client of TF Serving
batches its requests without loading TensorFlow; the outputs go back into
input order wherever the batches were cut."""


def batch_indices(count, batch_size, batch_tokens, lengths):
  """How `count` inputs are batched.

  Args:
    count: the inputs.
    batch_size: inputs a batch (at most, with `batch_tokens`).
    batch_tokens: > 0: sorted by length and cut into batches of at most
      that many tokens, padding included (`length_batches`); 0: batches of
      `batch_size` in input order.
    lengths: () -> each input's length in tokens, called only where
      `batch_tokens` > 0.
  Returns:
    Lists of indices into the inputs.
  """
  if batch_tokens > 0:
    return length_batches(lengths(), batch_tokens, batch_size)
  return [list(range(start, min(start + batch_size, count)))
          for start in range(0, count, batch_size)]


def length_batches(lengths, batch_tokens, max_sentences):
  """Batches of texts of similar length, as OpenNMT-tf, fairseq and Marian
  batch a file.

  Args:
    lengths: each text's length in tokens.
    batch_tokens: the padded tokens a batch may hold (its longest length
      times its count); a text longer than that goes alone.
    max_sentences: the texts a batch may hold.
  Returns:
    Lists of indices into `lengths`, sorted by length, longest first (so
    that a budget that is too large shows at once).
  """
  batches, batch, longest = [], [], 0
  for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
    longest_with = max(longest, lengths[i])
    if batch and (longest_with * (len(batch) + 1) > batch_tokens
                  or len(batch) == max_sentences):
      batches.append(batch)
      batch, longest_with = [], lengths[i]
    batch.append(i)
    longest = longest_with
  return batches + ([batch] if batch else [])


def word_lengths(texts):
  """Each text's length where its subwords cannot be counted (a client
  without the model's tokenizer, an export too old to count): its
  whitespace words, plus EOS."""
  return [len(text.split()) + 1 for text in texts]


def in_input_order(count, batches, run, progress=None):
  """Runs each batch and yields the results in input order, each as soon as
  the inputs before it are done (so that a command writes what it has while
  later batches run, and a failure part-way loses nothing written).

  Args:
    count: the inputs.
    batches: lists of indices into the inputs (`batch_indices`), each input
      in exactly one.
    run: a batch's indices -> one result an index, in the batch's order.
    progress: a `progress.Progress`, told of each batch's inputs.
  Yields:
    Each input's result, from input 0 on.
  Raises:
    ValueError: `run` gave a batch more or fewer results than its inputs,
      or an input is in no batch.
  """
  results, done, written = [None] * count, [False] * count, 0
  for rows in batches:
    answers = list(run(rows))
    if len(answers) != len(rows):
      raise ValueError(f"a batch of {len(rows)} inputs gave {len(answers)} "
                       "results")
    for row, result in zip(rows, answers):
      results[row], done[row] = result, True
    if progress:
      progress.add(len(rows))
    while written < count and done[written]:
      yield results[written]
      results[written] = None  # written: not held twice
      written += 1
  if written < count:
    raise ValueError(f"input {written} is in no batch")
