"""Front ends: the `attnstore` command line (and later the HTTP app). Thin: they call store, ingest and queries."""
