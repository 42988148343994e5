"""Entry points: compose the config, validate it, build the parts, run."""
