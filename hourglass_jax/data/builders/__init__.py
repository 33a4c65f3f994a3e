"""TFDS builders that write datasets as array_record files (enwik8, local text files, the standard library's
sources, digits), and the byte-chunk layout every text split is stored in."""
