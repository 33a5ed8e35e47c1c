"""The run layer: what a run directory holds (`run_dir`), and turning one
into a model, a `TranslationModule` or a `Translator` (`loading`) for the
commands under bin/. It sits above training, decoding and serving; nothing
below imports it."""
