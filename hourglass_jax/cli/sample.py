"""`hourglass-sample`: restores a trained checkpoint read-only and samples with the KV cache, through generation.py
(the path the trainer's end-of-run sample takes too; the cached decode loop itself is model/decode/sampling.py's).

Text configs continue a byte prompt; image configs (data.name an image dataset) complete images from scratch (the
start token alone) or from the top rows of real images of a split, and write a PNG grid. The sample batch is
padded to, and sharded over, the data-parallel devices like a training batch.
"""

import dataclasses
import math
import os

import jax
import numpy as np

from hourglass_jax import generation, weights
from hourglass_jax.config.run import RunConfig
from hourglass_jax.data.batches.image_source import START_TOKEN, open_images
from hourglass_jax.model import ModelConfig, build_model, decode
from hourglass_jax.model.decode import drafts, sampling
from hourglass_jax.runtime import compile_cache, paths
from hourglass_jax.runtime.sharding import make_mesh
from hourglass_jax.train.checkpointing import model_source
from hourglass_jax.train.checkpointing.checkpoint import NoCheckpointError, read_params
from hourglass_jax.train.compiled.state import make_init_fn, state_layout


@dataclasses.dataclass(frozen=True)
class SampleOptions:
  """What to sample. prompt: bytes (text); prompt_rows: image rows given from real images of `split` (0 = from
  scratch); max_new_tokens None: as many as fit in max_len, at most 256 (text), the rest of the image (images);
  max_len: the longest context to decode, None = data.seq_len (the trained one); end_byte: stop a text sample
  after this byte (None = never); output: the PNG path for images (None = WORKDIR/samples/images_stepN.png);
  draft: speculative decoding's draft, 'ngram', 'self' (the model's draft heads) or the workdir or export of a
  smaller model with the same vocabulary (None = plain decoding), proposing draft_tokens tokens per pass;
  fallback_below: sampling.generate's (None: its default, speculation while it is measured faster)."""
  prompt: bytes = b""
  num_samples: int = 4
  max_new_tokens: int | None = None
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  seed: int = 0
  end_byte: int | None = None
  prompt_rows: int = 0
  split: str | None = None
  max_len: int | None = None
  output: str | None = None
  draft: str | None = None
  draft_tokens: int = 4
  fallback_below: float | None = None


SEEDS = (-2**63, 2**63)  # jax.random.key takes a 64-bit integer
PROMPT_BYTES_CAP = 2**26  # a --prompt_file is read no further (a device or a pipe may never end)


def check_options(options: SampleOptions, vocab_size: int) -> None:
  """Value ranges of the sampling options, checked before anything is restored or compiled."""
  problems = (
      ("num_samples", options.num_samples, options.num_samples >= 1, "must be >= 1"),
      ("seed", options.seed, SEEDS[0] <= options.seed < SEEDS[1], "must be a 64-bit integer, in [-2**63, 2**63)"),
      ("max_new_tokens", options.max_new_tokens, options.max_new_tokens is None or options.max_new_tokens >= 1,
       "must be >= 1 (leave it unset for the default)"),
      ("max_len", options.max_len, options.max_len is None or options.max_len >= 1,
       "must be >= 1 (leave it unset for data.seq_len)"),
      ("temperature", options.temperature, math.isfinite(options.temperature) and options.temperature >= 0,
       "must be a finite number >= 0 (0 = greedy)"),
      ("top_k", options.top_k, options.top_k >= 0, "must be >= 0 (0 = all tokens)"),
      ("top_p", options.top_p, 0 < options.top_p <= 1, "must be in (0, 1] (1 = all tokens)"),
      ("end_byte", options.end_byte, options.end_byte is None or 0 <= options.end_byte < vocab_size,
       f"is outside the vocabulary 0..{vocab_size - 1}"),
      ("draft_tokens", options.draft_tokens, 1 <= options.draft_tokens <= sampling.MAX_DRAFT_TOKENS,
       f"must be in 1..{sampling.MAX_DRAFT_TOKENS} (proposals per pass; 4-8 is typical)"),
      ("fallback_below", options.fallback_below, options.fallback_below is None or
       0 <= options.fallback_below <= options.draft_tokens + 1,
       f"must be in [0, draft_tokens + 1 = {options.draft_tokens + 1}] (tokens per pass; 0 = never fall back)"),
      ("fallback_below", options.fallback_below, options.fallback_below is None or options.draft is not None,
       "applies to speculative decoding only; pass --draft (e.g. --draft=ngram) or leave it unset"),
  )
  for name, value, fine, rule in problems:
    if not fine:
      raise ValueError(f"{name}={value} {rule}.")


def check_memory(model_cfg: ModelConfig, num_samples: int, max_len: int) -> None:
  """Refuses `num_samples` whose decoding caches of `max_len` tokens alone exceed the memory of all the devices
  (the host's, on the CPU), before anything is restored or compiled: it would end in an out-of-memory error."""
  per_row = decode.cache_bytes(model_cfg, 1, max_len) + 4 * max_len
  limit, what = decode.memory_limit()
  if jax.default_backend() != "cpu":
    limit, what = limit * jax.device_count(), f"the {jax.device_count()} devices"
  if num_samples * per_row > limit:
    raise ValueError(f"num_samples={num_samples:,} needs about {num_samples * per_row / 2**30:,.1f} GiB for its "
                     f"decoding caches alone ({per_row / 2**20:,.2f} MiB per sample at max_len={max_len:,}), more "
                     f"than the {limit / 2**30:,.1f} GiB of {what}; lower --num_samples to at most "
                     f"{limit // per_row:,} (and sample again for more), or --max_len.")


def load_draft(spec: str | None, target: ModelConfig, log=print):
  """(Draft, its params) for --draft: None (plain decoding), 'ngram', or the folder of a smaller model: an export
  (config.json + model.safetensors) or a hourglass-train workdir (its newest checkpoint, read-only)."""
  if spec is None:
    return None, None
  if spec in drafts.DRAFTS and spec != "model":
    draft = drafts.DRAFTS[spec]()
    draft.check(target, None)
    return draft, None
  folder = paths.as_path(spec)
  if (folder / weights.CARD_FILE).exists() or spec.endswith(".safetensors"):
    model, params = weights.load_params(spec)
    draft_cfg = model.cfg
  elif (folder / "checkpoints").is_dir():
    try:
      params, step, record = read_params(spec, None, log=lambda message: None)
    except NoCheckpointError as error:
      raise ValueError(f"--draft={spec}: {error}") from None
    if "model" not in record:
      raise ValueError(f"--draft={spec}: checkpoint step {step} records no model config; export the draft with "
                       "hourglass-export and pass the export folder.")
    draft_cfg = ModelConfig.from_dict(record["model"])
  else:
    raise ValueError(f"--draft={spec} is neither a draft name ({', '.join(n for n in drafts.DRAFTS if n != 'model')}) "
                     "nor an export folder (config.json + model.safetensors) nor a hourglass-train workdir (with "
                     "checkpoints/); pass one of those.")
  draft = drafts.Model(draft_cfg)
  draft.check(target, params)
  log(f"draft: {spec} ({draft_cfg.kind} {draft_cfg.hierarchy}, d_model {draft_cfg.d_model})")
  return draft, params


def read_prompt_file(path: str, max_len: int) -> bytes:
  """--prompt_file's bytes, read no further than the longest prompt a cache of `max_len` tokens holds (a device
  such as /dev/zero, or a pipe, may never end)."""
  limit = min(max(max_len, 1), PROMPT_BYTES_CAP)
  with open(path, "rb") as f:
    prompt = f.read(limit + 1)
  if len(prompt) > limit == max_len:
    raise ValueError(f"--prompt_file={path} holds more than {limit:,} bytes, more than a context of max_len="
                     f"{max_len:,} tokens holds (--max_len, default data.seq_len); pass a shorter prompt file, or "
                     "raise --max_len.")
  if len(prompt) > limit:
    raise ValueError(f"--prompt_file={path} holds more than {limit:,} bytes, the most a prompt file may hold; pass "
                     "a shorter one.")
  return prompt


def prompt_bytes(text: str) -> bytes:
  """--prompt's bytes (UTF-8); bytes the shell passed through undecoded are refused, naming --prompt_file."""
  try:
    return text.encode("utf-8")
  except UnicodeEncodeError:
    raise ValueError("--prompt holds bytes that are not UTF-8 text; write the prompt's bytes to a file and pass "
                     "--prompt_file=FILE.") from None


def check_kind_options(options: SampleOptions, images: bool, dataset: str) -> None:
  """Options the config's kind of data would ignore, and an image --output that cannot be written, refused before
  anything is restored or compiled."""
  if images and options.prompt:
    raise ValueError(f"--prompt / --prompt_file are for text configs; data.name={dataset!r} is an image dataset: "
                     "drop the prompt, and pass --prompt_rows=N to complete real images from their top N rows.")
  if not images and options.prompt_rows:
    raise ValueError(f"--prompt_rows is for image configs; data.name={dataset!r} is text: drop it and give a "
                     "--prompt.")
  if not images and options.output:
    raise ValueError(f"--output writes image grids; data.name={dataset!r} is text, whose samples are printed: drop "
                     "it (redirect stdout to keep them).")
  if images and options.output and not paths.is_remote(options.output):
    path = os.path.abspath(os.path.expanduser(options.output))
    if os.path.isdir(path):
      raise ValueError(f"--output={options.output} is a folder; pass a PNG file path such as {path}/samples.png.")
    above = os.path.dirname(path)
    while not os.path.exists(above):
      above = os.path.dirname(above)
    if not os.path.isdir(above) or not os.access(above, os.W_OK):
      raise ValueError(f"--output={options.output} cannot be written ({above} is "
                       f"{'a file' if not os.path.isdir(above) else 'not writable'}); pass a PNG path in a writable "
                       "folder.")


def _image_prompts(run: RunConfig, options: SampleOptions, shape) -> tuple[np.ndarray, np.ndarray | None]:
  """(prompts [N, 1 + rows*W*C]: the start token and the top rows, originals [N, H, W, C] or None)."""
  height, width, channels = shape
  if not 0 <= options.prompt_rows < height:
    raise ValueError(f"prompt_rows={options.prompt_rows} must be in 0..{height - 1} for {height}x{width} images "
                     "(0 = from scratch).")
  start = np.full((options.num_samples, 1), START_TOKEN, np.int32)
  if not options.prompt_rows:
    return start, None
  split = options.split or run.data.eval_split
  source = open_images(run.data, split)
  originals = np.stack([source.image(i % len(source)) for i in range(options.num_samples)])
  rows = originals[:, :options.prompt_rows].reshape(options.num_samples, -1).astype(np.int32)
  return np.concatenate([start, rows], axis=1), originals


def _lengths(seq_len: int, options: SampleOptions, prompt_len: int, image_size: int | None) -> tuple[int, int]:
  """(max_new_tokens, max_len), checked: the prompt and the new tokens must fit in the cache (of max_len, default
  `seq_len`, the trained length)."""
  max_len = options.max_len or seq_len
  if prompt_len > max_len:
    raise ValueError(f"the prompt has {prompt_len} tokens but the cache holds max_len={max_len} (data.seq_len by "
                     "default); shorten the prompt or raise --max_len (beyond data.seq_len the model "
                     "extrapolates).")
  fits = max_len - prompt_len + 1
  default_new = min(256, fits) if image_size is None else image_size + 1 - prompt_len
  new = options.max_new_tokens if options.max_new_tokens is not None else default_new
  if image_size is not None and new != default_new:
    raise ValueError(f"max_new_tokens={new}, but completing the image after {options.prompt_rows} given rows takes "
                     f"{default_new} tokens; leave max_new_tokens unset for image configs.")
  if new < 1:
    raise ValueError(f"max_new_tokens={new} must be >= 1.")
  if prompt_len + new - 1 > max_len:
    raise ValueError(f"the prompt ({prompt_len} tokens) plus max_new_tokens={new} exceeds the cache of max_len="
                     f"{max_len} tokens (data.seq_len by default); lower --max_new_tokens to "
                     f"{fits} or raise --max_len (beyond data.seq_len the model extrapolates).")
  return new, max_len


def sample(run: RunConfig, workdir, options: SampleOptions, log=print) -> dict:
  """Samples from the newest checkpoint in `workdir` with the RunConfig `run`, or from the export folder `workdir`
  names (`run` then made from model_source.export_config). Returns {'step', 'tokens' [N, new] int32, 'seconds',
  'texts' (bytes each, prompt + continuation, cut after end_byte) or 'images' [N, H, W, C] uint8 and 'png'}."""
  model_cfg, seq_len = run.model, run.data.seq_len
  check_options(options, model_cfg.vocab_size)
  shape = run.data.spec.image_shape
  image_size = None if shape is None else int(np.prod(shape))
  check_kind_options(options, shape is not None, run.data.name)
  if shape is not None and options.output is None and model_source.is_export(workdir):
    raise ValueError(f"--workdir={workdir} is an export folder, which hourglass-sample does not write into; pass "
                     "--output=FILE.png for the image grid.")
  check_memory(model_cfg, options.num_samples, options.max_len or seq_len)
  draft, draft_params = load_draft(options.draft, model_cfg, log)
  if shape is None:
    prompts, originals = generation.byte_prompts(options.prompt, options.num_samples, model_cfg.vocab_size), None
  else:
    prompts, originals = _image_prompts(run, options, shape)
  new, _ = _lengths(seq_len, options, prompts.shape[1], image_size)

  mesh = make_mesh(run.mesh)
  with jax.set_mesh(mesh):  # the params alone, onto the model's shardings: no optimizer is built
    init_fn = make_init_fn(build_model(model_cfg), None, seq_len, run.train.seed)
    abstract, param_shardings = state_layout(init_fn, mesh, run.mesh.rules)
    params, step = model_source.read(workdir, abstract, run, log=log)
  generated = generation.generate_on_mesh(
      params, param_shardings, model_cfg, prompts, mesh, run.mesh.rules, max_new_tokens=new,
      seed=options.seed, temperature=options.temperature, top_k=options.top_k, top_p=options.top_p,
      end_token=options.end_byte if shape is None else None, draft=draft, draft_params=draft_params,
      draft_tokens=options.draft_tokens, fallback_below=options.fallback_below)
  tokens, seconds, compiled = generated.tokens, generated.seconds, generated.compile_seconds
  log(f"step {step}: {options.num_samples} samples x {new} tokens in {seconds:.2f}s "
      f"({options.num_samples * new / seconds:,.0f} tokens/s with the KV cache; compiled in {compiled:.1f}s, "
      f"{compile_cache.describe(generated.cache)})")
  if generated.speculation is not None:
    log(speculation_line(generated.speculation, options))
  result = dict(step=step, tokens=tokens, seconds=seconds)
  if shape is None:
    result["texts"] = generation.texts(options.prompt, tokens, options.end_byte)
    return result
  return dict(result, **_write_images(workdir, options, step, prompts, tokens, shape, originals, log))


def speculation_line(stats, options: SampleOptions) -> str:
  """What speculative decoding did, in one line (speculative.Stats.describe)."""
  return stats.describe(options.draft, options.draft_tokens)


def _write_images(workdir, options, step, prompts, tokens, shape, originals, log) -> dict:
  from hourglass_jax.data.batches.images import (  # pylint: disable=import-outside-toplevel
      save_png_grid, tokens_to_images)

  pixels = np.concatenate([prompts[:, 1:], tokens], axis=1)  # without the start token
  images = tokens_to_images(pixels, *shape)
  grid = images if originals is None else np.concatenate([images, originals])
  shown = options.output or f"{str(workdir).rstrip('/')}/samples/images_step{step}.png"  # as the user wrote it
  path = paths.as_path(shown)
  if jax.process_index() == 0:
    save_png_grid(grid, path, columns=options.num_samples if originals is not None else None,
                  scale=max(1, 64 // shape[1]), inside=None if options.output else workdir)
  what = "from scratch" if originals is None else (f"from their top {options.prompt_rows} rows (originals in the "
                                                   "last row)")
  log(f"wrote {len(images)} images completed {what} to {shown}")
  return dict(images=images, png=str(path))
