"""lenbench's models: position families, scaling methods, attention and the decoder."""
