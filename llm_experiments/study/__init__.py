"""The study that uses the harness: sweeps, results, predictions, verdicts, claims and the demo. Nothing in the harness imports it."""
