"""absl flags of bin/export.py, and the `Runner.export` arguments they
mean."""

from absl import flags

from tf_transformer.choices import ALIGNMENT_LAYER_WITH_SAVED_MODEL
from tf_transformer.choices import DTYPES
from tf_transformer.choices import XLA_WITH_SHORTLIST
from tf_transformer.run import translator_flags

# Flags that are `Runner.export` arguments of the same name.
EXPORT_ARGUMENTS = ("checkpoint", "format", "max_input_tokens", "xla",
                    "decode_parts", "quantization", "dtype",
                    "ensemble_average", "alignment_layer")


def define_flags():
  flags.DEFINE_multi_string(
      "model_dir", None, "A training run or an averaged one; repeated "
      "(--model_dir=A --model_dir=B, runs or RUN/ckpt-N checkpoints of one "
      "vocabulary), one SavedModel that decodes them as an ensemble.")
  flags.DEFINE_string("checkpoint", None, "A checkpoint path, or 'best': "
                      "the run's best by dev BLEU (or loss, --best_metric "
                      "of bin/train.py), kept in MODEL_DIR/best/ (default: "
                      "the newest in --model_dir).")
  flags.DEFINE_string("export_dir", None, "saved_models/NAME; the version "
                      "folder is added.")
  translator_flags.define_decoding_flags()
  translator_flags.define_ensemble_flag()
  translator_flags.define_shortlist_flag()
  flags.DEFINE_integer("max_input_tokens", 256, "Longer inputs are cut.")
  flags.DEFINE_enum("format", "saved_model",
                    ["saved_model", "ctranslate2", "transformers"],
                    "saved_model: for TensorFlow Serving; ctranslate2: for "
                    "the CTranslate2 engine (same weights, same search "
                    "options); transformers: a MarianMTModel directory for "
                    "Transformers and the Hugging Face Hub (post-norm, "
                    "sinusoidal models).")
  flags.DEFINE_enum("quantization", None, ["int8", "int8_float32", "int16",
                                           "float16", "bfloat16"],
                    "--format=ctranslate2 only: store the weights in this "
                    "type (default float32; CTranslate2 can still quantize "
                    "at load).")
  flags.DEFINE_integer("alignment_layer", None, "--format=ctranslate2 "
                       "only: the decoder layer (from 1) whose attention, "
                       "averaged over its heads, CTranslate2 returns for "
                       "translate.py --alignment (default: the last; it "
                       "keeps one layer's).", lower_bound=1)
  flags.DEFINE_enum("dtype", "float32", list(DTYPES),
                    "--format=saved_model: the weights' and matmuls' type. "
                    "bfloat16 halves the export and the bytes each step "
                    "reads, fast where the CPU has AVX512_BF16 or AMX (or "
                    "on a GPU); softmax, layer norm and scores stay "
                    "float32.")
  flags.DEFINE_integer("decode_parts", 1, "Decode each request as this many "
                       "length-sorted slices at once: one per core, for a "
                       "server run with --tensorflow_intra_op_parallelism=1 "
                       "(docs/serving.md).", lower_bound=1)
  flags.DEFINE_bool("xla", False, "Compile the search with XLA (serve with "
                    "--xla_cpu_compilation_enabled on CPU), one program per "
                    "request shape: a power-of-2 batch, a multiple of 16 "
                    "subwords (docs/serving.md).")
  flags.mark_flags_as_required(["model_dir", "export_dir"])
  flags.register_multi_flags_validator(
      ["alignment_layer", "format"],
      lambda f: f["alignment_layer"] is None or f["format"] == "ctranslate2",
      ALIGNMENT_LAYER_WITH_SAVED_MODEL)
  flags.register_multi_flags_validator(
      ["xla", "shortlist"], lambda f: not (f["xla"] and f["shortlist"]),
      XLA_WITH_SHORTLIST)
  flags.register_multi_flags_validator(
      ["xla", "decode_parts"],
      lambda f: not (f["xla"] and f["decode_parts"] > 1),
      "--xla with --decode_parts > 1: XLA would compile the parts anew for "
      "every request; choose one")


def export_arguments(values=None) -> dict:
  """`Runner.export` keyword arguments from the flags, the decoding
  overrides included."""
  values = values or flags.FLAGS
  arguments = {name: values[name].value for name in EXPORT_ARGUMENTS}
  arguments["ensemble"] = values.model_dir[1:]
  arguments["shortlist"] = translator_flags.shortlist(values)
  arguments.update(translator_flags.decoding_overrides(values))
  return arguments
