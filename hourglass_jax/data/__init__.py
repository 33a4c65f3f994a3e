"""Data, from a `data.name` to batches. The folders in the order data flows; each imports only from its own row or
the rows above it:

  catalog.py   what each data.name is (text or image), what preparing it needs, and the splits every dataset has
  builders/    TFDS builders writing array_record files: enwik8.py, text_files.py (text_files, and stdlib_text from
               embedded.py), digits.py; byte_chunks.py is the layout of every text split (written as chunks, read
               back as one byte array)
  io/          tfds_io.py builds a dataset (prepare) and opens one split's records (open_split), with
               no_tensorflow.py letting TFDS's own image builders run without TensorFlow; prepare.py is the
               `hourglass-data prepare` command over it
  batches/     settings.py is the `data` config section; sources.py turns it and a split into a random-access
               source: training windows over a text split (a TFDS dataset, or a local file read directly), eval
               windows that score every byte once (eval_windows.py), whole images (image_source.py, images.py), or
               synthetic tokens; pipeline.py makes grain batches of any source: shuffled, endless, resumable
               training batches and padded eval batches

hourglass_jax/train/ joins the last row: `sources.make_source`, then `pipeline.train_iterator` / `eval_iterator`.
"""
