"""The report's sections, one module per metric family (plus findings, configuration and other
metrics).

Each section function takes the report folder, the labelled rows and the plot style, writes its
tables and figures, and returns its Markdown (with a note instead when its metric has no rows).
"""
