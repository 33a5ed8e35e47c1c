"""absl flags of benchmarks/benchmark.py."""

from absl import flags

from tf_transformer.run import translator_flags

SECTIONS = ("train", "scaling", "decode", "serving", "litert_step",
            "shortlist", "input")


def define_flags():
  flags.DEFINE_string("config", "base", "Model preset.")
  flags.DEFINE_string("hparams", "", "Config overrides.")
  flags.DEFINE_integer("vocab_size", 37000, "Vocabulary size of the model.")
  flags.DEFINE_list("sections", ["train", "scaling", "decode"],
                    f"Any of {', '.join(SECTIONS)}.")
  flags.DEFINE_string("model_dir", None, "serving: a trained run or an "
                      "averaged one.")
  flags.DEFINE_string("source", None, "serving: source sentences, one per "
                      "line (real text, e.g. Multi30k's test_2016_flickr.en).")
  flags.DEFINE_string("reference", None, "serving: references for BLEU.")
  flags.DEFINE_integer("serving_sentences", 1000, "serving: lines of --source "
                       "decoded in each pass.")
  flags.DEFINE_integer("serving_batch_size", 32, "serving: sentences per "
                       "request.")
  flags.DEFINE_integer("latency_sentences", 100, "serving: sentences decoded "
                       "one at a time for the latency figures (0: none).")
  flags.DEFINE_integer("clients", 8, "serving: concurrent callers of one "
                       "loaded model, one sentence a call, over the "
                       "--latency_sentences (0: no concurrency figures).",
                       lower_bound=0)
  flags.DEFINE_integer("profile_sentences", 10, "serving: one-sentence "
                       "requests profiled to count the kernels a decoding "
                       "step executes (0: none).", lower_bound=0)
  flags.DEFINE_string("serving_shortlist", "20,300", "serving: K,N of "
                      "the *_shortlist and ct2_*_vmap decoders (export "
                      "--shortlist; the run's table is built where missing).")
  translator_flags.register_shortlist_validator("serving_shortlist")
  flags.DEFINE_list("litert_step_rows", ["4", "128"], "litert_step: rows "
                    "a decoding step runs (4: one sentence at beam 4; 128: "
                    "a batch of 32).")
  flags.DEFINE_integer("litert_steps", 32, "litert_step: decoder steps a "
                       "timed loop runs (and the cache holds).")
  flags.DEFINE_list("shortlist_vocab_sizes", ["8000", "37000"], "shortlist: "
                    "vocabulary sizes of the synthetic shortlist section.")
  flags.DEFINE_integer("threads", 2, "serving: CPU threads of each decoder.")
  flags.DEFINE_list("serving_decoders", None, "serving: a subset of the "
                    "decoders (default: all).")
  flags.DEFINE_list("serving_searches", ["beam", "greedy"], "serving: beam, "
                    "greedy or both.")
  flags.DEFINE_list("serving_orders", ["file", "sorted"], "serving: file "
                    "order, length-sorted, or both.")
  flags.DEFINE_integer("batch_tokens", 4096, "Tokens per side of a training "
                       "batch (the paper: 25000 over 8 GPUs).")
  flags.DEFINE_integer("source_length", 32, "Sentence length of the training "
                       "batches (both sides).")
  flags.DEFINE_list("scaling_lengths", ["16", "64", "256"], "Source lengths "
                    "of the scaling section.")
  flags.DEFINE_list("train_variants", ["default", "no_xla_loss",
                                       "bfloat16", "mirrored"],
                    "Training variants to run: default, no_xla_loss, "
                    "xla_attention, bfloat16, mirrored.")
  flags.DEFINE_integer("cpu_devices", 2, "Logical CPU devices for the "
                       "MirroredStrategy variant.")
  flags.DEFINE_integer("runs", 3, "Timed runs per figure (median reported).")
  flags.DEFINE_integer("warmup", 2, "Untimed runs before them.")
  flags.DEFINE_integer("matmul_size", 4096, "n of the n^3 peak matmul.")
  flags.DEFINE_integer("decode_sentences", 256, "Sentences per decoding run.")
  flags.DEFINE_integer("decode_words", 7, "Words per decoded sentence (one "
                       "subword each, plus EOS: the output length).")
  flags.DEFINE_integer("decode_batch_size", 32, "The larger decoding batch.")
  flags.DEFINE_list("token_steps", ["10", "50", "100"], "Output lengths at "
                    "which the time per output token is measured.")
  flags.DEFINE_integer("bandwidth_megabytes", 256, "Size of the tensor read "
                       "to measure how fast a decoding cache can be read "
                       "(more than the CPU's caches).")
  flags.DEFINE_list("beam_sizes", ["1", "4", "8"], "Beam sizes compared.")
  flags.DEFINE_integer("model_seed", 0, "Seed of the decoding model's random "
                       "weights, so that runs decode the same outputs.")
  flags.DEFINE_integer("input_pairs", 4_500_000, "input: pairs of the "
                       "corpus built from Multi30k (WMT 2014 En-De: 4.5M).")
  flags.DEFINE_string("input_dir", "/tmp/tf_transformer_input", "input: where "
                      "the corpus and its prepared arrays are kept (reused).")
  flags.DEFINE_string("multi30k_dir", "../shared/data/multi30k", "input: "
                      "Multi30k's gzipped train.en/train.de.")
  flags.DEFINE_integer("input_vocab_size", 37000, "input: the vocabulary "
                       "(the paper's 37,000 for WMT En-De).")
  flags.DEFINE_integer("input_max_length", 256, "input: --max_length.")
  flags.DEFINE_integer("input_batch_tokens", 25000, "input: --batch_tokens "
                       "(the paper's 25,000).")
  flags.DEFINE_integer("input_batches", 200, "input: batches timed.")
  flags.DEFINE_integer("input_step_batch_tokens", 3125, "input: --batch_tokens"
                       " of the bin/train.py start (25,000 / 8 GPUs).")
  flags.DEFINE_string("output", "benchmark.json", "Where the JSON goes.")
  flags.register_validator("sections", lambda s: set(s) <= set(SECTIONS),
                           f"--sections: each must be one of {SECTIONS}")
  flags.register_validator("token_steps",
                           lambda steps: all(int(n) >= 6 for n in steps),
                           "--token_steps: each must be >= 6 (half of it, "
                           "minus the 2 source tokens, must leave an output)")
