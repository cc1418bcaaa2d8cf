"""Features: Kaldi-compatible fbank (and the ReDimNet2 log-mel front end), computed in torch on any
device, and the offline feature store."""
