"""What every part of the package stands on (typed config sections, local or bucket paths and atomic file
writes, the device mesh, joining a multi-process run, XLA options, the compilation cache, host memory)."""
