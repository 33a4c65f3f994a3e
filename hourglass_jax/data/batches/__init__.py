"""From the data section to batches (random-access sources of training windows, eval windows that score every
byte once, whole images or synthetic tokens, and the grain pipelines over them)."""
