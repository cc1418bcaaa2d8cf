"""Speaker diarization on the embedders of speakerlab.inference: who spoke when in a recording.

    from speakerlab.diarization import Diarizer, DiarizeOptions, SpeakerCount, make_vad
    from speakerlab.inference.embedder import load_embedder

    diarizer = Diarizer(load_embedder("exp/campplus"), make_vad("silero"), DiarizeOptions(seed=0))
    result = diarizer.diarize_file("meeting.wav", SpeakerCount(min=2, max=6))
    for turn in result.turns:
        print(turn.start, turn.end, turn.speaker)

Modules: vad (Silero and energy speech detection), cluster (spectral clustering with eigengap, AHC),
pipeline (`Diarizer`), cli (`speakerlab-diarize`), der (`speakerlab-der`: DER with pyannote.metrics);
segmentation (the powerset segmentation model and its loss, torch), segmentation_train
(`speakerlab-segmentation-train`), segmenter (its ONNX file run torch-free: speech and overlapped speech).
RTTM and the other list files are speakerlab.dataio.tables.rttm. docs/diarization.md tells the whole story.
"""

from speakerlab.diarization.clustering.cluster import SpeakerCount
from speakerlab.diarization.pipeline import Diarization, DiarizeOptions, Diarizer
from speakerlab.diarization.vad import make_vad

__all__ = ["Diarization", "Diarizer", "DiarizeOptions", "SpeakerCount", "make_vad"]
