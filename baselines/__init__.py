"""Classical (non-learned) placers, one module each, registered through the `placebench.placers` entry points."""
