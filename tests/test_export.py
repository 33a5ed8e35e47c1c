"""The SavedModel for TF Serving: loads with only tensorflow and
tensorflow_text, holds only core TF and tensorflow-text ops and no XLA,
answers bad requests, and translates like the in-process beam search; in
float32 and in bfloat16 (`--dtype=bfloat16`)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the ops the graph uses)
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow.python.framework import op_def_registry

from tf_transformer import build_model
from tf_transformer.data import numbers
from tf_transformer.data import token_store
from tf_transformer.data.epoch_batches import EpochBatches
from tf_transformer.data.sources import DataSpec
from tf_transformer.data import sequences
from tf_transformer.decoding.bans import Bans
from tf_transformer.decoding.greedy import greedy_search
from tf_transformer.run import run_dir
from tf_transformer.run.runner import Runner
from tf_transformer.serving import export as export_lib
from tf_transformer.translators.translator import Translator
from tf_transformer.special_ids import BOS_ID, EOS_ID, PAD_ID
from conftest import TRAINED_EXPORT
from conftest import UNTRAINED_EXPORT_OFFSET as OFFSET
from conftest import load_saved_model, run_script
from conftest import start_script
import rounding
import search_reference
from training_helpers import beam_search as model_beam_search

PYTHON_OPS = {"PyFunc", "PyFuncStateless", "EagerPyFunc"}


def _source_ids(vocabulary, texts):
  return sequences.source_ids(vocabulary, tf.constant(texts)).to_tensor()


# The session's untrained run and its export (bin/export.py,
# --max_length_offset=OFFSET), read only.
@pytest.fixture(name="model_dir")
def _model_dir(untrained_export):
  """A run directory with config, vocabulary and one checkpoint."""
  return untrained_export[0]


@pytest.fixture(name="exported")
def _exported(untrained_export):
  return untrained_export[1]


@pytest.fixture(scope="module")
def exported_bfloat16(trained_numbers_run, tmp_path_factory):
  """The session's trained run exported by bin/export.py with
  --dtype=bfloat16 and `trained_export`'s options, and the export's
  stderr."""
  export_dir = tmp_path_factory.mktemp("saved_models") / "numbers_bf16"
  result = run_script(
      "export.py", f"--model_dir={trained_numbers_run}",
      f"--export_dir={export_dir}", "--dtype=bfloat16",
      f"--max_input_tokens={TRAINED_EXPORT['max_input_tokens']}",
      f"--max_length_offset={TRAINED_EXPORT['max_decode_length_offset']}")
  assert result.returncode == 0, result.stderr[-2000:]
  return export_dir / "1", result.stderr


EXPORTS = {"float32": lambda request: request.getfixturevalue("exported"),
           "bfloat16": lambda request: request.getfixturevalue(
               "exported_bfloat16")[0]}


@pytest.mark.slow
def test_versions_are_integer_folders_written_whole(model_dir, exported,
                                                   tmp_path):
  # An export killed once its version folder is being written (a kill
  # earlier writes nothing; later, the version is whole) leaves no numbered
  # folder: only its hidden .writing-N-PID, which the next export removes.
  export_dir = tmp_path / "numbers"
  shutil.copytree(exported.parent, export_dir)
  killed = start_script("export.py", f"--model_dir={model_dir}",
                        f"--export_dir={export_dir}")
  writing = f".writing-2-{killed.pid}"
  deadline = time.time() + 300
  while not (export_dir / writing).exists() and killed.poll() is None:
    assert time.time() < deadline
    time.sleep(0.01)
  killed.kill()
  assert killed.wait() == -signal.SIGKILL
  assert sorted(os.listdir(export_dir)) == [writing, "1"]

  result = run_script("export.py", f"--model_dir={model_dir}",
                      f"--export_dir={export_dir}")
  assert result.returncode == 0, result.stderr[-2000:]
  assert f"removed {export_dir / writing}, left by an export that was " \
      "stopped" in result.stderr
  assert sorted(os.listdir(export_dir)) == ["1", "2"]
  assert (export_dir / "1" / "saved_model.pb").exists()
  assert (export_dir / "2" / "saved_model.pb").exists()
  # Given the folder, not a version, translate.py names the newest whole
  # version (an empty one, as an older release's killed export left, not).
  (export_dir / "3").mkdir()
  with pytest.raises(FileNotFoundError, match=(
      f"pass one of its version folders, e.g. the newest, {export_dir}/2$")):
    Translator.from_export(str(export_dir))
  (export_dir / "3").rmdir()


LOAD = r"""
import json, sys
import tensorflow as tf
import tensorflow_text  # registers the SentencePiece ops
model = tf.saved_model.load(sys.argv[1])
serve = model.signatures["serving_default"]
answers = {}
requests = {"normal": ["four hundred and twenty-one", "seven"],
            "empty": [""], "spaces": ["     "], "long": ["nine " * 1000],
            "bad_utf8": [b"\xff\xfe seven \xc3"], "empty_batch": [],
            "batch_256": ["twelve"] * 256}
for name, batch in requests.items():
  out = serve(text=tf.constant(batch, tf.string, shape=[len(batch)]))
  answers[name] = {"translation": [t.decode("utf-8", "replace") for t in
                                   out["translation"].numpy()],
                   "score": out["score"].numpy().tolist()}
nbest = model.signatures["nbest"](text=tf.constant(["seven"]))
answers["nbest_shape"] = list(nbest["translations"].shape)
for signature in ("attention", "alignment"):
  for name in ("normal", "empty_batch", "bad_utf8"):
    batch = requests[name]
    out = model.signatures[signature](
        text=tf.constant(batch, tf.string, shape=[len(batch)]))
    answers[f"{signature}_{name}"] = {k: list(v.shape) for k, v in out.items()}
wrong_rank = {"matrix": [["seven", "eight"], ["nine", "ten"]], "scalar": "seven"}
for name, value in wrong_rank.items():
  for signature in ("serving_default", "nbest", "attention", "alignment"):
    try:
      model.signatures[signature](text=tf.constant(value))
      answers[f"{signature}_{name}"] = "answered"
    except tf.errors.InvalidArgumentError as e:
      answers[f"{signature}_{name}"] = e.message.splitlines()[-2].strip()
try:
  model.signatures["ids"](source_ids=tf.constant([[[5, 2]]]))
  answers["ids_rank_3"] = "answered"
except tf.errors.InvalidArgumentError as e:
  answers["ids_rank_3"] = e.message.splitlines()[-2].strip()
answers["modules"] = sorted(m for m in sys.modules if m.startswith("tf_transformer"))
print(json.dumps(answers))
"""


@pytest.mark.slow
@pytest.mark.parametrize("dtype", EXPORTS)
def test_loads_in_a_fresh_process_and_answers_bad_requests(request, dtype):
  exported = EXPORTS[dtype](request)
  result = subprocess.run([sys.executable, "-c", LOAD, str(exported)],
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
  assert result.returncode == 0, result.stderr[-3000:]
  answers = json.loads(result.stdout.strip().splitlines()[-1])
  assert answers["modules"] == []
  assert len(answers["normal"]["translation"]) == 2
  assert all(np.isfinite(answers["normal"]["score"]))
  for name in ("empty", "spaces", "long", "bad_utf8"):
    assert len(answers[name]["translation"]) == 1
  # 1000 words are cut to the export's limit (the default 256 subwords, or
  # the trained export's 24); the output to input + the export's offset.
  limit, offset = ((256, OFFSET) if dtype == "float32" else (
      TRAINED_EXPORT["max_input_tokens"],
      TRAINED_EXPORT["max_decode_length_offset"]))
  assert len(answers["long"]["translation"][0]) < 20 * (limit + offset)
  assert answers["empty_batch"] == {"translation": [], "score": []}
  assert len(answers["batch_256"]["translation"]) == 256
  assert answers["nbest_shape"] == [1, 4]
  layers_heads = [2, 4]  # the tiny preset
  empty = answers["attention_empty_batch"]
  assert empty["encoder_decoder"] == [0] + layers_heads + [0, 0]
  assert empty["translation"] == [0]
  assert answers["attention_bad_utf8"]["encoder_self"][:3] == [1] + layers_heads
  empty = answers["alignment_empty_batch"]
  assert empty == {"translation": [0], "score": [0], "source_tokens": [0, 0],
                   "target_tokens": [0, 0], "cross_attention": [0, 2, 0, 0]}
  assert answers["alignment_bad_utf8"]["cross_attention"][:2] == [1, 2]
  # Another rank is refused, not flattened into a batch of 4 (or 1).
  for signature in ("serving_default", "nbest", "attention", "alignment"):
    assert answers[f"{signature}_matrix"] == (
        "Shape of tensor text [2,2] is not compatible with expected shape [?].")
    assert answers[f"{signature}_scalar"] == (
        "Shape of tensor text [] is not compatible with expected shape [?].")
  assert "[1,1,2] is not compatible with expected shape [?,?]" in \
      answers["ids_rank_3"]


def _searched(model_dir, loaded, texts):
  """(model, source ids, the best outputs' ids with their EOS) of the
  export `loaded` of `model_dir` for `texts`: its `ids` signature runs the
  search every signature runs."""
  model, vocab = run_dir.load_trained_model(str(model_dir))
  source_ids = _source_ids(vocab, texts)
  outputs = loaded.signatures["ids"](source_ids=source_ids)["target_ids"]
  return model, rounding.unpadded(source_ids), rounding.unpadded(outputs)


@pytest.mark.numeric
def test_attention_signature_gives_tokens_and_distributions(model_dir,
                                                            exported):
  loaded = load_saved_model(exported)
  texts = tf.constant(["four hundred and twenty-one", "seven"])
  out = loaded.signatures["attention"](text=texts)
  best = loaded.signatures["serving_default"](text=texts)
  np.testing.assert_array_equal(out["translation"], best["translation"])
  # The same search gives the same score (what translate.py --alignment
  # prints with --show_scores), by the weights' attention kernels: two
  # paths, each within its float32 bound (rounding.py). The untrained
  # model's outputs run to the length limit (no EOS).
  model, sources, outputs = _searched(model_dir, loaded, texts)
  rounding.assert_within(out["score"], best["score"],
                         2 * rounding.output_bounds(model, sources, outputs))
  source_tokens = np.array([[p.decode() for p in row]
                            for row in out["source_tokens"].numpy()])
  target_tokens = np.array([[p.decode() for p in row]
                            for row in out["target_tokens"].numpy()])
  batch, s = source_tokens.shape
  t = target_tokens.shape[1]
  assert out["encoder_self"].shape == (batch, 2, 4, s, s)
  assert out["decoder_self"].shape == (batch, 2, 4, t, t)
  assert out["encoder_decoder"].shape == (batch, 2, 4, t, s)
  for row in range(batch):
    source = [p for p in source_tokens[row] if p]
    target = [p for p in target_tokens[row] if p]
    assert source[-1] == "</s>"
    assert "".join(source[:-1]).replace("\u2581", " ").strip() == (
        texts[row].numpy().decode())
    assert source_tokens[row][len(source):].tolist() == [""] * (
        s - len(source))
    cross = out["encoder_decoder"][row, :, :, :len(target)].numpy()
    # Each output token's attention over the real source tokens sums to 1
    # and gives padding nothing: the quotients of a float32 softmax over L
    # keys, e_i / sum(e), their sum within L + 1 roundings of 1 (the sum of
    # the e_i, the quotients), summed again in float32 (L - 1 more).
    length = len(source)
    rounding.assert_within(cross[..., :length].sum(-1), 1.0,
                           (2 * length + 2) * rounding.U32)
    assert np.all(cross[..., len(source):] == 0)
    decoder = out["decoder_self"][row].numpy()
    assert np.all(np.triu(decoder[0, 0], 1) == 0)  # causal
    # Padding queries (the shorter sentence's rows) attend nowhere.
    assert np.all(out["encoder_self"][row, :, :, len(source):].numpy() == 0)
    assert np.all(out["encoder_decoder"][row, :, :, len(target):].numpy()
                  == 0)
    assert np.all(decoder[:, :, len(target):] == 0)


@pytest.mark.numeric
def test_alignment_signature_is_the_cross_attention_averaged_over_heads(
    model_dir, exported):
  """What word alignments need, a heads-th of `attention`'s: the same
  search, tokens and encoder-decoder weights, heads averaged."""
  loaded = load_saved_model(exported)
  texts = tf.constant(["four hundred and twenty-one", "seven", ""])
  full = loaded.signatures["attention"](text=texts)
  out = loaded.signatures["alignment"](text=texts)
  assert sorted(out) == ["cross_attention", "score", "source_tokens",
                         "target_tokens", "translation"]
  for key in ("translation", "source_tokens", "target_tokens"):
    np.testing.assert_array_equal(out[key], full[key])
  # Two searches of one model: each score and each weight within its
  # float32 bound (rounding.py).
  model, sources, outputs = _searched(model_dir, loaded, texts)
  rounding.assert_within(out["score"], full["score"],
                         2 * rounding.output_bounds(model, sources, outputs))
  for layer in range(out["cross_attention"].shape[1]):
    _, bound = rounding.attention_bounds(
        model, sources, [o[:-1] for o in outputs], layer=layer)
    got = out["cross_attention"][:, layer].numpy()
    want = full["encoder_decoder"][:, layer].numpy().mean(axis=1)
    queries, keys = min(got.shape[1], bound.shape[1]), bound.shape[2]
    rounding.assert_within(got[:, :queries, :keys], want[:, :queries, :keys],
                           2 * bound[:, :queries])


@pytest.mark.slow
@pytest.mark.parametrize("decoding,flags,width,bans", [
    ("greedy", [], 1, Bans()),
    ("greedy", ["--min_length=3", "--no_repeat_ngram_size=2"], 1,
     Bans(3, 2)),
    ("sample", ["--num_samples=3", "--top_k=5", "--top_p=1e-6",
                "--temperature=2"], 3, Bans())])
def test_greedy_and_sampling_exports(model_dir, tmp_path, decoding, flags,
                                     width, bans):
  result = run_script("export.py", f"--model_dir={model_dir}",
                      f"--export_dir={tmp_path / decoding}",
                      f"--decoding={decoding}", "--max_length_offset=10",
                      *flags)
  assert result.returncode == 0, result.stderr[-2000:]
  path = str(tmp_path / decoding / "1")
  ops, _ = _all_ops(path)
  assert not ops & PYTHON_OPS
  loaded = tf.saved_model.load(path)
  texts = tf.constant(["four hundred and twenty-one", "seven"])
  nbest = loaded.signatures["nbest"](text=texts)
  assert nbest["translations"].shape == (2, width)
  # Greedy, and sampling from a nucleus smaller than the likeliest token's
  # probability (after top-k), both follow the most likely token (not
  # banned, where the export bans some).
  config, vocab = run_dir.load(str(model_dir))
  model = build_model(config)
  tf.train.Checkpoint(model=model).read(
      tf.train.latest_checkpoint(str(model_dir))).expect_partial()
  ids, _ = greedy_search(model, _source_ids(
      vocab, [t.decode() for t in texts.numpy()]), 10, bans=bans)
  expected = vocab.detokenize(ids).numpy()
  for column in range(width):
    np.testing.assert_array_equal(nbest["translations"][:, column], expected)


def _all_ops(path):
  proto = saved_model_pb2.SavedModel()
  with open(os.path.join(path, "saved_model.pb"), "rb") as f:
    proto.ParseFromString(f.read())
  graph = proto.meta_graphs[0].graph_def
  nodes = list(graph.node)
  functions = list(graph.library.function)
  for function in functions:
    nodes.extend(function.node_def)
  return {node.op for node in nodes}, functions


@pytest.mark.parametrize("dtype", EXPORTS)
def test_graph_has_only_core_and_tensorflow_text_ops(request, dtype):
  exported = EXPORTS[dtype](request)
  ops, functions = _all_ops(str(exported))
  function_names = {f.signature.name for f in functions}
  unknown = {op for op in ops if op not in function_names and
             op_def_registry.get(op) is None}
  assert not unknown, f"ops neither in TensorFlow nor tensorflow-text: {unknown}"
  assert not ops & PYTHON_OPS
  assert not [op for op in ops if op.startswith("Xla") or op.startswith("_Xla")]
  assert "SentencepieceTokenizeOp" in ops and "SentencepieceDetokenizeOp" in ops
  for function in functions:
    attributes = function.attr
    assert not ("_XlaMustCompile" in attributes and
                attributes["_XlaMustCompile"].b), function.signature.name
  # The search is stored once without a prefix and once with one, and every
  # signature calls those two (saving traced a tf.function attribute anew,
  # which stored and traced it twice more).
  searches = [name for name in function_names if "_decode_" in name]
  assert len(searches) == 2, searches
  # Likewise the teacher-forced pass: stored once, called by the four
  # signatures that teacher-force.
  forced = [name for name in function_names
            if "_logits_and_attention_" in name]
  assert len(forced) == 1, forced
  for signature in ("score", "forced_alignment", "attention", "alignment"):
    assert forced[0] in _reachable(functions, f"__inference_{signature}_"), (
        signature)


def _reachable(functions, prefix):
  """The names of the functions that the one whose name starts with `prefix`
  calls, directly or through others (cond branches, loop bodies)."""
  by_name = {f.signature.name: f for f in functions}
  (start,) = [name for name in by_name if name.startswith(prefix)]
  seen, todo = set(), [start]
  while todo:
    for node in by_name[todo.pop()].node_def:
      called = {a.func.name for a in node.attr.values() if a.func.name}
      called.add(node.op)
      for name in (called & by_name.keys()) - seen:
        seen.add(name)
        todo.append(name)
  return seen


@pytest.mark.numeric
def test_export_translates_like_the_in_process_search(model_dir, exported):
  config, vocab = run_dir.load(str(model_dir))
  model = build_model(config)
  tf.train.Checkpoint(model=model).read(
      tf.train.latest_checkpoint(str(model_dir))).expect_partial()
  texts = ["four hundred and twenty-one", "seven"]
  ids, scores = model_beam_search(model, _source_ids(
      vocab, texts), beam_size=4, alpha=0.6, max_length_offset=OFFSET)
  expected = [t.decode() for t in vocab.detokenize(ids[:, 0]).numpy()]
  loaded = load_saved_model(exported)
  out = loaded.signatures["serving_default"](text=tf.constant(texts))
  got = [t.decode() for t in out["translation"].numpy()]
  same = _same_but_near_ties(model, vocab, texts, expected, got, OFFSET)
  # The export's graph and eager calls: two paths, each within its float32
  # bound (rounding.py).
  bound = 2 * rounding.output_bounds(model, rounding.unpadded(_source_ids(
      vocab, texts)), rounding.unpadded(ids[:, 0]))
  rounding.assert_within(np.asarray(out["score"])[same],
                         scores.numpy()[same, 0], bound[same])


def _same_but_near_ties(model, vocab, texts, first, second, offset):
  """The lines where two searches' translations agree, asserting that the
  others differ only where rounding can tip a decision (beam 4, alpha
  0.6)."""
  processor = spm.SentencePieceProcessor(model_proto=vocab.model_proto)
  apart = search_reference.lines_apart(
      model, [ids + [EOS_ID] for ids in processor.encode(texts)],
      [[processor.encode(t)] for t in first],
      [[processor.encode(t)] for t in second], max_length_offset=offset)
  return [line not in apart for line in range(len(texts))]


@pytest.mark.slow
@pytest.mark.numeric
def test_xla_export_is_compiled_only_when_asked(model_dir, exported,
                                               tmp_path):
  result = run_script("export.py", f"--model_dir={model_dir}",
                      f"--export_dir={tmp_path / 'xla'}", "--xla",
                      f"--max_length_offset={OFFSET}")
  assert result.returncode == 0, result.stderr[-2000:]
  _, functions = _all_ops(str(tmp_path / "xla" / "1"))
  assert any("_XlaMustCompile" in f.attr and f.attr["_XlaMustCompile"].b
             for f in functions)
  # Requests of any size (padded to buckets inside) translate as without XLA.
  xla = tf.saved_model.load(str(tmp_path / "xla" / "1"))
  plain = load_saved_model(exported)
  model, vocab = run_dir.load_trained_model(str(model_dir))
  texts = ["four hundred and twenty-one", "seven", "twelve thousand and six"]
  for batch in (texts, texts[:1]):
    want = plain.signatures["serving_default"](text=tf.constant(batch))
    got = xla.signatures["serving_default"](text=tf.constant(batch))
    decoded = lambda out: [t.decode() for t in out["translation"].numpy()]
    same = _same_but_near_ties(model, vocab, batch, decoded(want),
                               decoded(got), OFFSET)
    _, sources, outputs = _searched(model_dir, plain, batch)
    bound = 2 * rounding.output_bounds(model, sources, outputs)
    rounding.assert_within(np.asarray(got["score"])[same],
                           np.asarray(want["score"])[same], bound[same])


def test_xla_export_refuses_decode_parts(model_dir, tmp_path):
  result = run_script("export.py", f"--model_dir={model_dir}",
                      f"--export_dir={tmp_path / 'xla'}", "--xla",
                      "--decode_parts=2")
  assert result.returncode != 0
  assert "--xla with --decode_parts > 1" in result.stderr


def test_training_batches_and_the_saved_model_give_the_same_ids(
    model_dir, exported, tmp_path):
  """One text -> ids definition: training tokenizes its corpus once with
  SentencePiece's own library (`token_store`), the SavedModel in the graph
  with tensorflow-text. For each pair, the training batch's source row
  equals the SavedModel's source ids of the source text, its labels the
  SavedModel's ids of the target text (subwords then EOS), and the decoder
  input is BOS + labels shifted right; only the SavedModel cuts long
  inputs."""
  _, vocab = run_dir.load(str(model_dir))
  loaded = load_saved_model(exported)
  pairs = [("four hundred and twenty-one", "vierhundert"),
           ("seven", "sieben und zwölf"), ("  twelve  thousand ", "zwölf"),
           ("naïve café — 東京", "Grüße, ☃ \u00e9")]
  (tmp_path / "s.txt").write_text("".join(s + "\n" for s, _ in pairs))
  (tmp_path / "t.txt").write_text("".join(t + "\n" for _, t in pairs))
  spec = DataSpec(dataset="", train_source=str(tmp_path / "s.txt"),
                  train_target=str(tmp_path / "t.txt"))
  store = token_store.write(str(tmp_path), "train", spec, vocab)
  batches = EpochBatches(store, batch_tokens=256, max_length=64)  # 1 corpus
  for i, (source, target) in enumerate(pairs):
    (source_row,), (target_in,), (labels,) = _one_pair_batch(batches, i)
    trim = lambda ids: [int(i) for i in ids if i != PAD_ID]
    saved = lambda text: trim(loaded.source_ids(tf.constant([text]))[
        "source_ids"].numpy()[0])
    assert trim(source_row) == saved(source)
    assert trim(labels) == saved(target)
    assert trim(target_in) == [BOS_ID] + saved(target)[:-1]
  long = loaded.source_ids(tf.constant(["nine " * 1000, "seven"]))
  assert long["source_ids"].shape == (2, 256 + 1)
  assert long["source_ids"][0, -1] == EOS_ID


def _one_pair_batch(batches, pair):
  """The batch arrays of `batches` holding only pair `pair`."""
  order, starts, ends, groups = batches.plan(0)
  where = int(np.flatnonzero(order == pair)[0])
  b = int(np.flatnonzero((starts <= where) & (where < ends))[0])
  row = int(np.flatnonzero(np.sort(order[starts[b]:ends[b]]) == pair)[0])
  return [array[row:row + 1] for array in batches.batch(0, b)]


def _variables(path):
  """{name: dtype} of an export's saved variables, and their bytes."""
  prefix = os.path.join(str(path), "variables", "variables")
  dtypes = tf.train.load_checkpoint(prefix).get_variable_to_dtype_map()
  size = sum(os.path.getsize(os.path.join(str(path), "variables", name))
             for name in os.listdir(os.path.join(str(path), "variables")))
  return dtypes, size


def test_bfloat16_export_keeps_half_the_bytes(trained_export,
                                             exported_bfloat16):
  full, full_size = _variables(trained_export)
  half, half_size = _variables(exported_bfloat16[0])
  weights = {name for name, dtype in full.items() if dtype == tf.float32}
  assert weights and weights == set(half) - {
      name for name, dtype in half.items() if not dtype.is_floating}
  assert {half[name] for name in weights} == {tf.bfloat16}
  assert half_size < 0.55 * full_size, (half_size, full_size)
  # The signatures take and give what the float32 export's do.
  for path in (trained_export, exported_bfloat16[0]):
    serve = load_saved_model(path).signatures["serving_default"]
    assert {k: v.dtype for k, v in serve.structured_outputs.items()} == {
        "translation": tf.string, "score": tf.float32}


@pytest.mark.parametrize("dtype", EXPORTS)
def test_the_embedding_table_is_stored_once(request, model_dir, dtype):
  """The decoding step reads the model's own embedding table (scaling the
  rows it reads), so an export holds one [vocab, d_model] matrix, the
  model's shared embeddings (3.4), beside the step's [d_model, vocab]
  projection."""
  config, _ = run_dir.load(str(model_dir))
  vocab, d_model = config.model.vocab_size, config.model.d_model
  prefix = os.path.join(str(EXPORTS[dtype](request)), "variables",
                        "variables")
  shapes = tf.train.load_checkpoint(prefix).get_variable_to_shape_map()
  tables = [name for name, shape in shapes.items() if shape == [vocab, d_model]]
  assert len(tables) == 1, tables
  assert [shape for shape in shapes.values() if shape == [d_model, vocab]]


def test_bfloat16_export_warns_only_where_the_cpu_lacks_bfloat16(
    exported_bfloat16, tmp_path):
  warning = export_lib.bfloat16_warning()
  _, stderr = exported_bfloat16
  assert ("export: warning: " in stderr) == (warning is not None), stderr
  with_bf16 = tmp_path / "with"
  with_bf16.write_text("flags : fpu sse2 avx2 avx512f avx512_bf16\n")
  assert export_lib.bfloat16_warning(str(with_bf16)) is None
  without = tmp_path / "without"
  without.write_text("flags : fpu sse2 avx2 avx512f\n")
  assert "neither AVX512_BF16 nor AMX" in export_lib.bfloat16_warning(
      str(without))
  assert "could not read" in export_lib.bfloat16_warning(
      str(tmp_path / "missing"))
  # A float32 export names the bfloat16 instructions where the CPU has
  # them, and says nothing where it has none.
  note = export_lib.float32_note(str(with_bf16))
  assert "AVX512_BF16" in note and "--dtype=bfloat16" in note
  assert export_lib.float32_note(str(without)) is None
  assert export_lib.float32_note(str(tmp_path / "missing")) is None


@pytest.mark.numeric
@pytest.mark.bfloat16
def test_bfloat16_export_translates_like_float32(trained_numbers_run,
                                                 trained_export,
                                                 exported_bfloat16):
  """A trained model's bfloat16 export gives the float32 export's
  translations (the session's `trained_export`, exported with the same
  options) but where bfloat16's rounding can tip a decision of the search,
  and scores within bfloat16's rounding (tests/test_model_policy.py)."""
  sources = [s for s, _ in numbers.generate({"test": 64}, seed=11)["test"]]
  full, half = (load_saved_model(path).signatures["nbest"](
      text=tf.constant(sources)) for path in (trained_export,
                                              exported_bfloat16[0]))
  same = (full["translations"][:, 0].numpy()
          == half["translations"][:, 0].numpy())
  model, vocab = run_dir.load_trained_model(str(trained_numbers_run))
  processor = spm.SentencePieceProcessor(model_proto=vocab.model_proto)
  ids = lambda out: processor.encode([t.decode() for t in
                                      out["translations"][:, 0].numpy()])
  full_ids, half_ids = ids(full), ids(half)
  source_ids = [s + [EOS_ID] for s in processor.encode(sources)]
  decoding = model.config.decoding
  # Two implementations: float32, and bfloat16's weights and activations
  # (its softmaxes, layer norms and scores in float32), each within its
  # bound (rounding.py).
  precisions = (rounding.FLOAT32, rounding.Precision("bfloat16"))
  search_reference.assert_near_ties(
      model, source_ids, list(np.flatnonzero(~same)),
      alpha=decoding.length_penalty_alpha,
      max_length_offset=TRAINED_EXPORT["max_decode_length_offset"],
      why=lambda line: f"{full_ids[line]}, {half_ids[line]}",
      precisions=precisions)
  outputs = [ids + [EOS_ID] for ids in full_ids]
  bound = sum(rounding.output_bounds(model, source_ids, outputs, precision)
              for precision in precisions)
  rounding.assert_within(half["scores"][:, 0].numpy()[same],
                         full["scores"][:, 0].numpy()[same], bound[same])


def test_bfloat16_is_refused_for_ctranslate2(model_dir, tmp_path):
  with pytest.raises(ValueError, match="--dtype=bfloat16: only for "
                     "--format=saved_model"):
    Runner(str(model_dir)).export(str(tmp_path / "ct2"),
                                  format="ctranslate2", dtype="bfloat16")
