"""Data, from a `data.name` to batches. The files in the order data flows; each imports only from its own row or
the rows above it:

  catalog.py   what each data.name is (text or image), what preparing it needs, and the splits every dataset has
  builders     TFDS builders writing array_record files: enwik8.py, text_files.py (text_files, and stdlib_text from
               embedded.py), digits.py; byte_chunks.py is the layout of every text split (written as chunks, read
               back as one byte array); no_tensorflow.py lets TFDS's own image builders run without TensorFlow
  tfds_io.py   builds a dataset (prepare) and opens one split's records (open_split); prepare.py is the
               `hourglass-data prepare` command over it
  sources      sources.py turns the config and a split into a random-access source: training windows over a text
               split (a TFDS dataset, or a local file read directly), eval windows that score every byte once
               (eval_windows.py), whole images (image_source.py, images.py), or synthetic tokens
  pipeline.py  grain batches of any source: shuffled, endless, resumable training batches and padded eval batches

hourglass_jax/train/ joins the last two: `sources.make_source`, then `pipeline.train_iterator` / `eval_iterator`.
"""
