"""Deterministic synthetic speaker corpus for the offline mini recipe.

voice.py: speaker traits and source-filter synthesis of phone strings with a per-session channel, on the STFT
grid of spectra.py;
rooms.py: synthetic noise, music and room impulse responses; __main__.py: the corpus writer,
``speakerlab-synth --out DIR`` (Kaldi data dirs, MUSAN- and RIRS_NOISES-shaped sets).
"""

from .spectra import SR
from .voice import Session, SpeakerTraits, draw_session, draw_speaker, synth_utterance

__all__ = ["SR", "Session", "SpeakerTraits", "draw_session", "draw_speaker", "synth_utterance"]
