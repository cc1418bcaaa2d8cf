"""Synthetic speaker corpus (see voice.py, rooms.py; CLI: python -m speakerlab.synth)."""
