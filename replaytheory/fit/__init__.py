"""Constants from measurements: probe tables, their estimators, the calibration and the diagnosis (theory.md sections 8, 10, 11)."""
