"""Built-in platform backends, one module per platform."""
