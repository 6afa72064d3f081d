"""What a conversion reads: the item every source yields, and each kind of source."""
