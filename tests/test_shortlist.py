"""The vocabulary shortlist (`data/shortlist_table.py`,
`decoding/shortlist.py`, export --shortlist): the table ranks by Dice
co-occurrence; a search over a shortlist outputs only its pieces, scored
by the model's probabilities renormalized over them; a shortlist of the
whole vocabulary decodes exactly as no shortlist, in every mode."""

import collections
import dataclasses
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the ops the graph uses)

from tf_transformer.data import numbers
from tf_transformer.data import sequences
from tf_transformer.data import shortlist_table
from tf_transformer.data import token_store
from tf_transformer.data.errors import DataError
from tf_transformer.decoding import prefix as prefix_lib
from tf_transformer.decoding import shortlist as shortlist_lib
from tf_transformer.decoding.beam_search import length_penalty
from tf_transformer.decoding.ensemble import Ensemble
from tf_transformer.decoding.ensemble import step_of
from tf_transformer.decoding.search import DecodingOptions
from tf_transformer.decoding.search import decode
from tf_transformer.run import run_dir
from tf_transformer.serving.translation_module import TranslationModule
from tf_transformer import special_ids
from tf_transformer.special_ids import PAD_ID
from conftest import run_script
import rounding
import search_reference
import training_helpers

pytestmark = pytest.mark.numeric

SOURCES = [s for s, _ in numbers.generate({"test": 12}, seed=9)["test"]]
_Vocabulary = collections.namedtuple("_Vocabulary", "vocab_size model_proto")


@dataclasses.dataclass
class _Store:
  source: np.ndarray
  target: np.ndarray
  offsets: np.ndarray

  @property
  def num_pairs(self):
    return len(self.offsets) - 1


def _store(pairs):
  lengths = np.array([[len(s), len(t)] for s, t in pairs])
  offsets = np.concatenate([[[0, 0]], np.cumsum(lengths, 0)])
  return _Store(np.concatenate([s for s, _ in pairs]).astype(np.uint16),
                np.concatenate([t for _, t in pairs]).astype(np.uint16),
                offsets)


PAIRS = [([10, 11], [20, 21]), ([10, 12], [20, 22]), ([11], [21, 4]),
         ([12, 12], [22, 4])]


def test_the_table_ranks_target_pieces_by_dice_then_count_then_id():
  table = shortlist_table.build([_store(PAIRS)], _Vocabulary(30, b"v"),
                                k_max=4, n_max=3)
  # dice(10, 20) = 2 * 2 / (2 + 2) = 1; (10, 21) and (10, 22) 0.5 each.
  assert table.candidates[10].tolist() == [20, 21, 22, -1]
  assert table.candidates[11].tolist() == [21, 4, 20, -1]
  # A piece twice in one source counts once a pair.
  assert table.candidates[12].tolist() == [22, 4, 20, -1]
  assert (table.candidates[13] == -1).all()
  assert table.frequent.tolist() == [4, 20, 21]  # 2 tokens each: by id
  assert table.pairs == 4


def test_chunks_and_corpora_count_as_one(monkeypatch):
  whole = shortlist_table.build([_store(PAIRS * 3)], _Vocabulary(30, b"v"))
  monkeypatch.setattr(shortlist_table, "PAIRS_A_CHUNK", 3)
  split = shortlist_table.build([_store(PAIRS * 2), _store(PAIRS)],
                                _Vocabulary(30, b"v"))
  np.testing.assert_array_equal(whole.candidates, split.candidates)
  np.testing.assert_array_equal(whole.frequent, split.frequent)
  # max_pairs takes every other pair of 12: each of the 4 kinds once or
  # twice, so the same ranking.
  sampled = shortlist_table.build([_store(PAIRS * 3)], _Vocabulary(30, b"v"),
                                  max_pairs=6)
  assert sampled.pairs == 6


def test_a_table_of_another_vocabulary_or_none_is_refused_by_name(tmp_path):
  vocab = training_helpers.vocabulary()
  with pytest.raises(DataError, match="no shortlist table.*build_shortlist"):
    shortlist_table.load(str(tmp_path), vocab)
  table = shortlist_table.build([_store(PAIRS)], _Vocabulary(
      vocab.vocab_size, b"another"))
  shortlist_table.save(table, str(tmp_path))
  with pytest.raises(DataError, match="another vocabulary"):
    shortlist_table.load(str(tmp_path), vocab)
  with pytest.raises(ValueError, match="holds 50 candidates"):
    table.cut(60, 10)


@pytest.fixture(scope="module")
def run(trained_numbers_run):
  model, vocab = run_dir.load_trained_model(str(trained_numbers_run))
  stores = [store for store, _ in token_store.open_training(
      str(trained_numbers_run), training_helpers.SPEC, vocab)]
  return model, vocab, shortlist_table.build(stores, vocab, k_max=8,
                                             n_max=20)


def _source_ids(vocab, texts=SOURCES):
  return sequences.source_ids(vocab.make_tokenizer(),
                              tf.constant(texts), 24).to_tensor()


@pytest.mark.parametrize("method", ["beam", "greedy"])
def test_outputs_lie_in_the_shortlist_scored_over_it(run, method):
  model, vocab, table = run
  shortlist = shortlist_lib.Shortlist(*table.cut(2, 5))
  source_ids = _source_ids(vocab)
  options = DecodingOptions(method=method, max_decode_length_offset=10)
  ids, scores = decode(model, source_ids, options, shortlist=shortlist)
  allowed = shortlist_lib.vocabulary(shortlist, source_ids).numpy()
  assert len(allowed) < vocab.vocab_size
  best = ids[:, 0].numpy()
  assert np.isin(best, allowed).all()
  # Each score: the model's teacher-forced log-probabilities renormalized
  # over the shortlist, summed, over the length penalty.
  target = tf.RaggedTensor.from_tensor(best, padding=PAD_ID)
  logits = model((source_ids, sequences.decoder_input(target.to_tensor())))
  log_probs = tf.nn.log_softmax(tf.gather(logits, allowed, axis=-1))
  local = np.searchsorted(allowed, target.to_tensor().numpy())
  picked = tf.gather(log_probs, local, batch_dims=2)
  mask = tf.sequence_mask(target.row_lengths(), tf.shape(local)[1])
  total = tf.reduce_sum(tf.where(mask, picked, 0.0), 1)
  penalty = length_penalty(target.row_lengths(), options.length_penalty_alpha)
  # The cached step and teacher forcing: two paths, each within its float32
  # bound (rounding.py) over the shortlist.
  sources = rounding.unpadded(source_ids)
  bound = rounding.output_bounds(model, sources, target.to_list(),
                                 vocabulary=list(allowed))
  rounding.assert_within(scores[:, 0], total / penalty, 2 * bound)
  # Over fewer pieces, the same hypothesis scores at least as well.
  full_ids, full = decode(model, source_ids, options)
  full_bound = rounding.output_bounds(model, sources,
                                      rounding.unpadded(full_ids[:, 0]))
  assert np.mean(scores[:, 0]) >= np.mean(full[:, 0]) - np.mean(
      bound + full_bound)


def _whole_vocabulary(vocab):
  return shortlist_lib.Shortlist(np.full([vocab.vocab_size, 1], -1, np.int32),
                                 np.arange(vocab.vocab_size, dtype=np.int32))


@pytest.mark.parametrize("mode", ["beam", "nbest", "greedy", "sample",
                                  "parts", "prefix", "ensemble"])
def test_a_shortlist_of_every_piece_decodes_as_none(run, mode):
  model, vocab, _ = run
  source_ids = _source_ids(vocab)
  options = DecodingOptions(max_decode_length_offset=10)
  kwargs = {}
  if mode == "greedy":
    options = dataclasses.replace(options, method="greedy")
  elif mode == "nbest":
    options = dataclasses.replace(options, beam_size=6)
  elif mode == "sample":
    options = dataclasses.replace(options, method="sample", num_samples=3,
                                  seed=7)
  elif mode == "parts":
    options = dataclasses.replace(options, parts=2)
  elif mode == "prefix":
    kwargs["prefix"] = prefix_lib.Prefix(
        tf.constant([[10, 11]] * len(SOURCES)),
        tf.constant([2, 1, 0] * (len(SOURCES) // 3)))
  elif mode == "ensemble":
    model = Ensemble([model, model], "probs")
  plain = decode(model, source_ids, options, **kwargs)
  listed = decode(model, source_ids, options,
                  shortlist=_whole_vocabulary(vocab), **kwargs)
  # The output projection over gathered columns: other kernels, the same
  # outputs but where a decision lies within both paths' float32 rounding
  # (tests/search_reference.py), the same scores within their bounds
  # (rounding.py).
  sources = rounding.unpadded(source_ids)
  if mode == "sample":
    # A draw lands on another piece only within rounding of a boundary of
    # the cumulative distribution (the draws are TensorFlow's own, unseen
    # here): some 1e-5 of the mass a draw, so on a line in a thousand.
    same = np.all(plain[0].numpy() == listed[0].numpy(), axis=(1, 2))
    assert same.mean() >= 0.75, same
  else:
    beam = options.beam_size if options.method == "beam" else 1
    forced = ([[10, 11][:n] for n in [2, 1, 0] * (len(SOURCES) // 3)]
              if mode == "prefix" else None)
    apart = search_reference.lines_apart(
        model, sources, [rounding.unpadded(r) for r in plain[0].numpy()],
        [rounding.unpadded(r) for r in listed[0].numpy()], beam_size=beam,
        alpha=options.length_penalty_alpha, max_length_offset=10,
        prefixes=forced)
    same = np.array([line not in apart for line in range(len(SOURCES))])
  bound = 2 * np.stack([rounding.output_bounds(model, sources,
                                               rounding.unpadded(column))
                        for column in np.moveaxis(plain[0].numpy(), 1, 0)],
                       1)
  rounding.assert_within(plain[1].numpy()[same], listed[1].numpy()[same],
                         bound[same])


@pytest.mark.slow  # an export, saved and loaded
def test_an_export_takes_the_shortlist_and_scores_stay_full(run, tmp_path):
  model, vocab, table = run
  shortlist = shortlist_lib.Shortlist(*table.cut(2, 5))
  texts = tf.constant(SOURCES)
  listed = TranslationModule(model, vocab, shortlist=shortlist)
  plain = TranslationModule(model, vocab)
  out = listed.nbest(texts)
  ids = listed.source_ids(texts)["source_ids"]
  allowed = shortlist_lib.vocabulary(shortlist, ids).numpy()
  # The search's own pieces (the text's, tokenized again, may be others:
  # "vier|tausend" can come back as "vi|ert|ausend").
  stored = listed._search(ids)
  assert np.isin(stored[0], allowed).all()
  best = stored[0][:, 0]
  assert [t.decode() for t in vocab.detokenize(best).numpy()] == [
      t.decode() for t in out["translations"][:, 0].numpy()]
  np.testing.assert_array_equal(
      listed.score(texts, out["translations"][:, 0])["log_prob"],
      plain.score(texts, out["translations"][:, 0])["log_prob"])
  # The export gathers its output projection as rows (`output_rows`); a
  # search that prepares its weights gathers columns: the same search, a
  # traced function against eager ops, apart only where a decision lies
  # within their float32 rounding (tests/search_reference.py), the scores
  # within their bounds (rounding.py).
  fresh = decode(listed.model, ids, listed.options, shortlist=shortlist)
  sources = rounding.unpadded(ids)
  apart = search_reference.lines_apart(
      model, sources, [rounding.unpadded(row) for row in stored[0].numpy()],
      [rounding.unpadded(row) for row in fresh[0].numpy()],
      beam_size=listed.options.beam_size,
      alpha=listed.options.length_penalty_alpha,
      max_length_offset=listed.options.max_decode_length_offset,
      vocabulary=list(allowed))
  same = np.array([line not in apart for line in range(len(SOURCES))])
  bound = 2 * np.stack([
      rounding.output_bounds(model, sources, rounding.unpadded(column),
                             vocabulary=list(allowed))
      for column in np.moveaxis(stored[0].numpy(), 1, 0)], 1)
  rounding.assert_within(stored[1].numpy()[same], fresh[1].numpy()[same],
                         bound[same])
  with pytest.raises(ValueError, match="--shortlist with --xla"):
    TranslationModule(model, vocab, shortlist=shortlist, xla=True)


def test_output_rows_restrict_to_the_same_weights(run):
  model, _, _ = run
  weights = step_of(model).prepare(20)
  vocab = tf.constant([0, 1, 2, 3, 7, 12, 25], tf.int32)
  by_columns = shortlist_lib.restrict(weights, vocab)
  rows = shortlist_lib.with_output_rows((weights, weights))
  assert rows[0].output_rows.shape == weights.output_kernel.shape[::-1]
  assert rows[0].output_kernel is None  # stored once, as rows
  for by_rows in shortlist_lib.restrict(rows, vocab):
    assert by_rows.output_rows is None
    assert by_rows.output_kernel.shape == [weights.output_kernel.shape[0], 7]
    tf.nest.map_structure(np.testing.assert_array_equal, by_columns, by_rows)


@pytest.mark.slow
def test_build_export_and_translate_from_the_command_line(
    trained_numbers_run, tmp_path):
  """bin/build_shortlist.py, then bin/export.py and bin/translate.py
  --shortlist, in fresh processes, as a user runs them; a run without a
  table gets one line naming the command that builds it."""
  run = tmp_path / "run"
  shutil.copytree(trained_numbers_run, run)
  run_dir.save(str(run), run_dir.load_config(str(run)), training_helpers.SPEC)
  missing = run_script("export.py", f"--model_dir={run}",
                       f"--export_dir={tmp_path}/none", "--shortlist=3,10")
  assert missing.returncode == 1
  assert "bin/build_shortlist.py" in missing.stderr
  bad = run_script("export.py", f"--model_dir={run}",
                   f"--export_dir={tmp_path}/none", "--shortlist=3")
  assert bad.returncode != 0 and "expected K,N" in bad.stderr
  built = run_script("build_shortlist.py", f"--model_dir={run}")
  assert built.returncode == 0, built.stderr
  assert os.path.exists(run / shortlist_table.FILENAME)
  exported = run_script("export.py", f"--model_dir={run}",
                        f"--export_dir={tmp_path}/listed", "--shortlist=3,10")
  assert exported.returncode == 0, exported.stderr
  text = "\n".join(SOURCES) + "\n"
  through_export = run_script("translate.py", f"--model={tmp_path}/listed/1",
                              input_text=text)
  through_run = run_script("translate.py", f"--model_dir={run}",
                           "--shortlist=3,10", input_text=text)
  assert through_export.returncode == 0, through_export.stderr
  assert len(through_export.stdout.splitlines()) == len(SOURCES)
  # The export's graph and the run's: the same lines but where a decision
  # lies within their float32 rounding (tests/search_reference.py), over
  # the batch's shortlist (one batch of 12 lines).
  model, vocab = run_dir.load_trained_model(str(run))
  table = shortlist_table.load(str(run), vocab)
  source_ids = _source_ids(vocab)
  allowed = shortlist_lib.vocabulary(shortlist_lib.Shortlist(
      *table.cut(3, 10)), source_ids).numpy()
  processor = vocab.make_tokenizer()
  encoded = lambda out: [[list(processor.tokenize(line).numpy())]
                         for line in out.stdout.splitlines()]
  search_reference.lines_apart(
      model, rounding.unpadded(source_ids), encoded(through_export),
      encoded(through_run), alpha=model.config.decoding.length_penalty_alpha,
      max_length_offset=model.config.decoding.max_decode_length_offset,
      vocabulary=list(allowed))


def test_ctranslate2_export_writes_the_table_as_its_vmap(
    trained_numbers_run, run, tmp_path):
  """The same cut table as CTranslate2's vocabulary map: the frequent pieces
  under the empty source, each source piece's candidates; the runtime
  decodes with it, outputs inside the batch's map."""
  from tf_transformer.run.runner import Runner  # pylint: disable=g-import-not-at-top
  from tf_transformer.interop import ct2  # pylint: disable=g-import-not-at-top
  from tf_transformer.translators import ct2_runtime  # pylint: disable=g-import-not-at-top
  _, vocab, table = run
  directory = tmp_path / "run"
  shutil.copytree(trained_numbers_run, directory)
  shortlist_table.save(table, str(directory))
  path = Runner(str(directory)).export(str(tmp_path / "ct2"),
                                       format="ctranslate2",
                                       shortlist=(2, 5))
  lines = (tmp_path / "ct2" / ct2.VMAP_FILE).read_text(
      encoding="utf-8").splitlines()
  processor = vocab.make_tokenizer()
  piece = lambda i: processor.id_to_string(i).numpy().decode()
  assert lines[0] == "\t" + " ".join(piece(i) for i in table.frequent[:5])
  rules = dict(line.split("\t") for line in lines[1:])
  for source, targets in list(rules.items())[:20]:
    row = table.candidates[processor.string_to_id(source).numpy()][:2]
    assert targets.split() == [piece(i) for i in row if i >= 0]
  decoder = ct2_runtime.CT2Decoder(path)
  assert decoder.use_vmap
  sources = decoder.pieces(SOURCES)
  allowed = set(lines[0].split()) | {"<unk>", "<s>", "</s>"}
  for pieces in sources:
    allowed |= {t for p in pieces for t in rules.get(p, "").split()}
  outputs = {p for result in decoder.translate_pieces(sources)
             for hypothesis in result.hypotheses for p in hypothesis}
  assert outputs and outputs <= allowed
  assert len(allowed) < vocab.vocab_size
  # Scoring and aligning given targets: references with pieces outside the
  # map (which the forced pass decodes with) get what an export without it
  # gives, to float32 rounding.
  references = [t for _, t in numbers.generate({"test": 12}, seed=9)["test"]]
  assert {p for t in decoder.processor.target(references) for p in t} - allowed
  plain = ct2_runtime.CT2Decoder(Runner(str(directory)).export(
      str(tmp_path / "ct2_plain"), format="ctranslate2"))
  model, _ = run_dir.load_trained_model(str(directory))
  source_ids = [[processor.string_to_id(p).numpy() for p in pieces] + [
      special_ids.EOS_ID] for pieces in sources]
  target_ids = [[processor.string_to_id(p).numpy() for p in pieces] + [
      special_ids.EOS_ID] for pieces in decoder.processor.target(references)]
  _, bound = rounding.token_bounds(model, source_ids, target_ids)
  for row, ((values, pairs), (want, want_pairs)) in enumerate(zip(
      decoder.forced_alignments(SOURCES, references),
      plain.forced_alignments(SOURCES, references))):
    # The vocabulary map's output projection has other shapes: other
    # kernels, each within its float32 bound (rounding.py).
    rounding.assert_within(values, want, 2 * bound[row, :len(want)])
    assert pairs == want_pairs
