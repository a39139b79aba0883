"""Data files shipped with eaglekit (calibration text)."""
