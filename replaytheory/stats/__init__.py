"""Reading learning curves and bootstrap verdicts over seeds (theory.md section 8.3)."""
