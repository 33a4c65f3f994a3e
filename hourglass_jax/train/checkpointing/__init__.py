"""What a run keeps of itself in its workdir and reads back (Orbax checkpoints with their fingerprints, the
one-writer lock), and where a command reads a trained model from (a workdir or an export)."""
