"""What translates and scores lines in process, through any export or run:
`translator` (a SavedModel version, a CTranslate2 directory or a run),
`scorer` (forced decoding of given translations) and `ct2_runtime` (the
CTranslate2 engine on our exports)."""
