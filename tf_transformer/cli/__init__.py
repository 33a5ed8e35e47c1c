"""The commands: each module's `run` is one installed `tf-transformer-*`
command (setup.py), and bin/ holds a door to each for a clone."""
