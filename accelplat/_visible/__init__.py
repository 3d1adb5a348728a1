"""Pure parsers of each vendor's visible-devices variables: ``cuda``, ``rocm``, ``oneapi``.

They read no environment and import no vendor library, so they can be tested exhaustively.
"""
