"""`hourglass-sample`'s flags (defined on import, by main.sample_entry only) and their translation into a call of
hourglass_jax.cli.sample.sample."""

import sys

import jax
from absl import flags

_PROMPT = flags.DEFINE_string("prompt", None, "Text prompt (UTF-8); text models need at least one byte.")
_PROMPT_FILE = flags.DEFINE_string("prompt_file", None, "Read the prompt's bytes from this file instead.")
_NUM_SAMPLES = flags.DEFINE_integer("num_samples", 4, "Samples to draw (the batch, sharded over the devices).")
_MAX_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", None, "Tokens to generate per sample (text default: as "
                                       "many as fit in --max_len, at most 256; images: the rest of the image).")
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "Softmax temperature; 0 = greedy.")
_TOP_K = flags.DEFINE_integer("top_k", 0, "Keep the k most likely tokens (0 = all).")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "Nucleus sampling: keep the most likely tokens up to this mass (1 = all).")
_SEED = flags.DEFINE_integer("seed", 0, "Random seed; the same seed, checkpoint and flags give the same samples.")
_END_BYTE = flags.DEFINE_integer("end_byte", None, "Text: stop a sample after this byte (e.g. 10 = newline).")
_PROMPT_ROWS = flags.DEFINE_integer("prompt_rows", 0, "Images: complete real images of --split from their top "
                                    "rows (0 = from scratch).")
_MAX_LEN = flags.DEFINE_integer("max_len", None, "Longest context to decode (default data.seq_len, the trained "
                                "length).")
_OUTPUT = flags.DEFINE_string("output", None, "Images: PNG path (default WORKDIR/samples/images_stepN.png).")
_DRAFT = flags.DEFINE_string("draft", None, "Speculative decoding (greedy: the same tokens; at temperature > 0 the "
                             "same distribution, not the samples this --seed gives without it; faster where the draft "
                             "is often right, docs/generation.md): 'self' (the model's own draft heads, "
                             "model.draft_heads), 'ngram' (proposals looked up in the prompt and the text so far) or "
                             "the workdir or export folder of a smaller model with the same vocabulary.")
_DRAFT_TOKENS = flags.DEFINE_integer("draft_tokens", 4, "Speculative decoding: tokens the draft proposes per pass.")
_FALLBACK_BELOW = flags.DEFINE_float("fallback_below", None, "Speculative decoding: tokens per pass under which it "
                                     "decodes plainly for a while, then tries the draft again (0 = never; default: "
                                     "speculate while it is measured faster than plain decoding).")


def _log(message: str) -> None:
  if jax.process_index() == 0:
    print(message, flush=True)


def run(run, workdir: str, split: str | None) -> dict:
  """Samples the RunConfig `run`'s model as the flags say; prints text samples (process 0)."""
  from hourglass_jax.cli.sample import (  # pylint: disable=import-outside-toplevel
      SampleOptions, prompt_bytes, read_prompt_file, sample)

  if _PROMPT.value is not None and _PROMPT_FILE.value is not None:
    raise ValueError("give --prompt or --prompt_file, not both.")
  if _PROMPT_FILE.value is not None:
    prompt = read_prompt_file(_PROMPT_FILE.value, _MAX_LEN.value or run.data.seq_len)
  else:
    prompt = prompt_bytes(_PROMPT.value or "")
  options = SampleOptions(prompt=prompt, num_samples=_NUM_SAMPLES.value, max_new_tokens=_MAX_NEW_TOKENS.value,
                          temperature=_TEMPERATURE.value, top_k=_TOP_K.value, top_p=_TOP_P.value, seed=_SEED.value,
                          end_byte=_END_BYTE.value, prompt_rows=_PROMPT_ROWS.value, split=split,
                          max_len=_MAX_LEN.value, output=_OUTPUT.value, draft=_DRAFT.value,
                          draft_tokens=_DRAFT_TOKENS.value, fallback_below=_FALLBACK_BELOW.value)
  result = sample(run, workdir, options, log=_log)
  for i, text in enumerate(result.get("texts", [])):
    _log(f"--- sample {i} ---")
    if jax.process_index() == 0:
      sys.stdout.buffer.write(text + b"\n")
      sys.stdout.flush()
  return result
