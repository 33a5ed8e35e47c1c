"""Other toolkits' model formats, one module a format, its importer beside
its exporter: `marian` (Transformers' MarianMTModel directories: import and
export), `marian_npz` (Marian's own releases: import), `opennmt_tf`
(OpenNMT-tf checkpoints: import) and `ct2` (CTranslate2 model directories:
export). What they share is `common`; no format module imports another."""
