"""Many answers decoded at once over one shared KV cache (continuous batching): `ppdkit serve`'s engine."""
