"""What a run tells and leaves for others, beside its checkpoints (throughput, MFU and TensorBoard summaries,
the start and end report, the plain run files, learning curves, the safetensors export)."""
