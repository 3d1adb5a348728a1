"""Pure parsers of the vendors' visible-devices variables: no environment, no vendor library."""
