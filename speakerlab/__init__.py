"""speakerlab: speaker-embedding training recipes.

Data flows top-down, one module per step:
lists -> audio -> augment -> features -> batches -> model -> loss -> checkpoint -> embeddings -> scores.
"""

__version__ = "0.1.0"
