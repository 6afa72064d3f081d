"""Rules: what every path agrees on, written once and framework-free — the output contract,
the dataset contract, loader options, the order of an epoch, augmentation, host parts,
`sharding=`, brace patterns."""
