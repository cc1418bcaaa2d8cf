"""Training-engine pieces used by speakerlab.train: precision, distributed set-up, batch planning,
monitoring. Each is usable and tested on its own."""
