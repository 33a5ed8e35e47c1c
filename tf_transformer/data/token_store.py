"""Training corpora tokenized once, kept as flat token-id arrays.

As fairseq's binarized datasets: preparation reads the training text once,
tokenizes it on every core (SentencePiece's own threads) and writes, per
training corpus (`CORPUS`: "train", or "train0", "train1", ... for several,
see `sources.corpora`),

- `CORPUS.source.npy`, `CORPUS.target.npy`: every pair's subword ids end to
  end, `uint16` when the vocabulary has at most 65,536 pieces (2 bytes a
  token), `int32` otherwise; no BOS/EOS (`sequences` adds them);
- `CORPUS.offsets.npy`: `int64` [pairs + 1, 2], where pair i's source ids
  are `source[offsets[i, 0]:offsets[i + 1, 0]]` and its target ids
  likewise in column 1;
- `CORPUS.tokens.json`: what the arrays were made from (the training data,
  the local files' sizes and modification times, the vocabulary's SHA-256)
  and their sizes, so that stale or damaged arrays are refused, never
  silently mixed.

Training opens the arrays memory-mapped (`np.load(mmap_mode="r")`): they
sit in the page cache, not in the process's own memory, and a batch reads
only its own pairs.
"""

import dataclasses
import itertools
import json
import os
import re
import time
from typing import Optional

from absl import logging
import numpy as np

from tf_transformer.data import corpora
from tf_transformer.data import errors
from tf_transformer.data import sources
from tf_transformer.data import vocabulary as vocabulary_lib
from tf_transformer.data.errors import DataError
from tf_transformer.progress import Progress

FORMAT = 1
ARRAYS = ("source", "target", "offsets")
CHUNK = 65_536  # pairs tokenized per SentencePiece call


def training_data(spec) -> dict:
  """What makes a DataSpec's training pairs what they are (dev and test,
  the seed and the TFDS folders aside); file paths made absolute."""
  fields = {name: getattr(spec, name) for name in (
      "dataset", "train_source", "train_target", "source_language",
      "target_language")}
  for name in ("train_source", "train_target"):
    if fields[name]:
      fields[name] = ",".join(os.path.abspath(path) for path in
                              fields[name].split(","))
  if spec.dataset == "numbers":
    fields["numbers_train_size"] = spec.numbers_train_size
  if spec.train_weights:
    fields["train_weights"] = spec.weights()
  return fields


def _origin(spec) -> dict:
  """The training data of a one-corpus `spec` and, for local files, their
  sizes and modification times."""
  files = {}
  for path in spec.files("train") if not spec.dataset else ():
    if path and os.path.exists(path):
      stat = os.stat(path)
      files[os.path.abspath(path)] = [stat.st_size, stat.st_mtime_ns]
  data = training_data(spec)
  if spec.dataset == "numbers":  # generated from the seed
    data["numbers_seed"] = spec.seed
  return {"data": data, "files": files}


def _path(directory, corpus, name):
  suffix = "tokens.json" if name == "manifest" else f"{name}.npy"
  return os.path.join(directory, f"{corpus}.{suffix}")


@dataclasses.dataclass
class TokenStore:
  """One split's token arrays (memory-mapped when opened)."""
  source: np.ndarray
  target: np.ndarray
  offsets: np.ndarray  # [pairs + 1, 2]
  manifest: dict

  @property
  def num_pairs(self) -> int:
    return len(self.offsets) - 1

  def lengths(self):
    """(source lengths, target lengths) in subwords, int64 [pairs] each."""
    lengths = np.diff(self.offsets, axis=0)
    return lengths[:, 0], lengths[:, 1]

  def pair(self, i):
    """(source ids, target ids) of pair `i`, as int32 arrays."""
    (s0, t0), (s1, t1) = self.offsets[i], self.offsets[i + 1]
    return (self.source[s0:s1].astype(np.int32),
            self.target[t0:t1].astype(np.int32))


def write(directory, corpus, spec, vocabulary, num_threads=None) -> TokenStore:
  """Reads the training pairs of a one-corpus `spec` once, tokenizes them
  with `vocabulary` on `num_threads` threads (default: every core) and
  writes their arrays to `directory` as `corpus` (see `sources.corpora`);
  pairs with an empty side are skipped (and counted in the manifest).
  Raises DataError naming a bad file and line."""
  num_threads = num_threads or os.cpu_count() or 1
  processors = {side: vocabulary.processor(side)
                for side in ("source", "target")}
  dtype = np.uint16 if vocabulary.vocab_size <= 2**16 else np.int32
  read = corpora.ReadStats()
  pairs = sources.text_pairs(spec, "train", read)()
  start = time.time()
  os.makedirs(directory, exist_ok=True)
  tmp = {name: _path(directory, corpus, name) + ".raw" for name in
         ("source", "target")}
  for path in tmp.values():
    if os.path.exists(path):
      logging.warning("replacing %s, left by a tokenization that was "
                      "stopped", path)
  try:
    with errors.unwrapped(), open(tmp["source"], "wb") as source_file, open(
        tmp["target"], "wb") as target_file, Progress(
            f"tokenized {corpus}:", None, "pairs") as progress:
      counts = _tokenize(pairs, processors, dtype, num_threads,
                         {"source": source_file, "target": target_file},
                         progress)
  except BaseException:  # a bad line, a full disk, Ctrl-C: leave nothing
    for path in tmp.values():
      if os.path.exists(path):
        os.remove(path)
    raise
  num_pairs = sum(len(lengths) for lengths in counts["source"])
  offsets = np.zeros([num_pairs + 1, 2], np.int64)
  for column, side in enumerate(("source", "target")):
    if counts[side]:
      np.cumsum(np.concatenate(counts[side]), out=offsets[1:, column])
  for side in ("source", "target"):  # raw bytes -> .npy, without a copy
    _raw_to_npy(tmp[side], _path(directory, corpus, side), dtype,
                int(offsets[-1, 0 if side == "source" else 1]))
  np.save(_path(directory, corpus, "offsets"), offsets)
  seconds = time.time() - start
  manifest = dict(_origin(spec), format=FORMAT, pairs=num_pairs,
                  skipped=dict(read.skipped), dtype=np.dtype(dtype).name,
                  source_tokens=int(offsets[-1, 0]),
                  target_tokens=int(offsets[-1, 1]),
                  vocabulary_sha256=vocabulary_lib.sha256(vocabulary),
                  tokenize_seconds=round(seconds, 3), threads=num_threads)
  with open(_path(directory, corpus, "manifest") + ".tmp", "w") as f:
    json.dump(manifest, f, indent=2)
  os.replace(_path(directory, corpus, "manifest") + ".tmp",
             _path(directory, corpus, "manifest"))
  logging.info("tokenized %d %s pairs in %.1f s on %d threads (%.0f pairs/s "
               "a thread) into %s", num_pairs, corpus, seconds, num_threads,
               num_pairs / max(seconds, 1e-9) / num_threads, directory)
  return open_store(directory, corpus, spec, vocabulary)


def _tokenize(pairs, processors, dtype, num_threads, files, progress):
  """Appends each side's ids of `pairs` to `files` (raw `dtype` values),
  CHUNK pairs a call of that side's processor; returns each side's
  lengths."""
  counts = {"source": [], "target": []}
  while True:
    chunk = list(itertools.islice(pairs, CHUNK))
    if not chunk:
      return counts
    for side, texts in zip(("source", "target"), zip(*chunk)):
      ids = processors[side].encode(list(texts), num_threads=num_threads)
      lengths = np.fromiter(map(len, ids), np.int64, len(ids))
      flat = np.fromiter(itertools.chain.from_iterable(ids), dtype,
                         int(lengths.sum()))
      files[side].write(flat.tobytes())
      counts[side].append(lengths)
    progress.add(len(chunk))


def _raw_to_npy(raw_path, npy_path, dtype, count):
  """Prepends a .npy header to a file of `count` raw `dtype` values."""
  header = np.lib.format.header_data_from_array_1_0(np.zeros(0, dtype))
  header["shape"] = (count,)
  with open(npy_path + ".tmp", "wb") as out, open(raw_path, "rb") as raw:
    np.lib.format.write_array_header_1_0(out, header)
    while True:
      block = raw.read(1 << 24)
      if not block:
        break
      out.write(block)
  os.remove(raw_path)
  os.replace(npy_path + ".tmp", npy_path)


def exists(directory, corpus) -> bool:
  return os.path.exists(_path(directory, corpus, "manifest"))


def open_store(directory, corpus, spec, vocabulary) -> TokenStore:
  """The arrays of `corpus` in `directory`, memory-mapped, after checking
  that they were made from the one-corpus `spec`'s training data (local
  files unchanged since) with `vocabulary`, and are whole. Raises DataError
  naming the file."""
  manifest_path = _path(directory, corpus, "manifest")
  try:
    with open(manifest_path) as f:
      manifest = json.load(f)
  except (OSError, ValueError) as e:
    raise DataError(f"{manifest_path}: cannot read ({e}); delete the "
                    f"{corpus}.* token files there to tokenize again") from None
  stale = _stale(manifest, spec, corpus, vocabulary)
  if stale:
    raise DataError(f"{manifest_path}: the token arrays there are stale: "
                    f"{stale}; delete {directory}/{corpus}.*.npy and "
                    f"{corpus}.tokens.json to tokenize again, or use another "
                    "directory")
  arrays = {}
  for name in ARRAYS:
    path = _path(directory, corpus, name)
    try:
      arrays[name] = np.load(path, mmap_mode="r")
    except (OSError, ValueError) as e:
      raise DataError(f"{path}: missing or damaged ({e}); delete the {corpus}."
                      "* token files to tokenize again") from None
  expected = {"source": (manifest["source_tokens"],),
              "target": (manifest["target_tokens"],),
              "offsets": (manifest["pairs"] + 1, 2)}
  for name in ARRAYS:
    if arrays[name].shape != expected[name]:
      raise DataError(
          f"{_path(directory, corpus, name)}: shape {arrays[name].shape}, but "
          f"{manifest_path} says {expected[name]} (a truncated copy?); delete "
          f"the {corpus}.* token files to tokenize again")
  return TokenStore(manifest=manifest, **arrays)


def _stale(manifest, spec, corpus, vocabulary) -> Optional[str]:
  """Why `manifest` does not describe `spec`'s training pairs tokenized by
  `vocabulary`, or None."""
  if manifest.get("format") != FORMAT:
    return f"format {manifest.get('format')}, expected {FORMAT}"
  if manifest.get("vocabulary_sha256") != vocabulary_lib.sha256(vocabulary):
    return "tokenized with another vocabulary"
  now = _origin(spec)
  if json.loads(json.dumps(now["data"])) != manifest["data"]:
    return f"made from {manifest['data']}, not {now['data']}"
  for path, (size, mtime) in manifest["files"].items():
    if now["files"].get(path) != [size, mtime]:
      return f"{path} changed since it was tokenized (size or time)"
  return None


def wait_for(directory, spec, timeout_secs=3600):
  """Non-chief workers wait for the chief to write `spec`'s arrays."""
  deadline = time.time() + timeout_secs
  for corpus, _, _ in sources.corpora(spec):
    while not exists(directory, corpus):
      if time.time() > deadline:
        raise TimeoutError(f"{directory}: the chief did not write "
                           f"{_path(directory, corpus, 'manifest')}")
      time.sleep(1)


def remove(directory):
  """Deletes every training corpus's arrays (the training data changed)."""
  for name in os.listdir(directory):
    if re.fullmatch(r"train\d*\.(tokens\.json|(source|target|offsets)\.npy)",
                    name):
      os.remove(os.path.join(directory, name))


def open_training(directory, spec, vocabulary, write_missing=True):
  """[(store, weight)] of each training corpus of `spec` (`sources.corpora`)
  in `directory`; a corpus whose arrays are not there is tokenized once and
  written (unless not `write_missing`); stale ones are refused."""
  stores = []
  for corpus, weight, one in sources.corpora(spec):
    if write_missing and not exists(directory, corpus):
      stores.append((write(directory, corpus, one, vocabulary), weight))
    else:
      stores.append((open_store(directory, corpus, one, vocabulary), weight))
  return stores


def all_written(directory, spec) -> bool:
  """Whether every training corpus of `spec` has arrays in `directory`."""
  return all(exists(directory, corpus)
             for corpus, _, _ in sources.corpora(spec))
