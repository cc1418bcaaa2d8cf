"""Open-set speaker identification: galleries of enrolled speakers (gallery.py), the decision "which of them, or
nobody" with the model's calibration (identify.py), and the console scripts speakerlab-enrol / speakerlab-identify
(cli.py). A consumer of inference/ (embedders, the torch-free ONNX runtime) and scoring/ (calibration): with a
waveform ONNX file, nothing here imports torch."""
