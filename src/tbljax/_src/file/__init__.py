"""The TBL file from Python: its bytes, its fields, fields read back."""
