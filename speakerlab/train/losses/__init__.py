"""What the step minimises: the margin heads on the hypersphere (AAM, SphereFace2), the same heads sharded over the
ranks (Partial FC), and how a head's rows go into and out of checkpoints."""
