"""speakerlab-folder: one's own recordings as Kaldi data dirs. scan.py reads the input (a folder tree or a CSV)
and gives it ids; cli.py converts, splits, writes the data dirs and trial lists (its docstring: the command)."""
