"""Sources -> a TBL file: options, records, labels, progress, the conversion itself."""
