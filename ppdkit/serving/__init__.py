"""`ppdkit serve`: the OpenAI-compatible server over the bundled decoder."""
