"""Jobs: the typed job spec and the pipeline's stages on Ray, submitted to a cluster or run here."""
