"""Scoring: cosine scoring of trial lists in blocks, score normalisation, QMF calibration, metrics
(EER, minDCF), reports and pictures."""
