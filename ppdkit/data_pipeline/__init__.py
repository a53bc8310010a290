"""Data: dataset readers, the teacher pass, the n-gram cache and the committed self-distilled corpus."""
