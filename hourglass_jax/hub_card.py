"""The Hugging Face Hub model card of an export: `README.md` beside `config.json`, YAML front matter (license,
library_name, pipeline_tag, tags, datasets where the data has a Hub id, model-index with the whole-split scores)
and a body with usage, the training data, the recipe, the scores and the limitations, all from the JSON card."""

import yaml

from hourglass_jax.data import catalog

README_FILE = "README.md"
_NOT_RECORDED = "not recorded"


def front_matter(card: dict) -> dict:
  """The Hub's metadata of the JSON `card`: keys it has no value for are left out (a missing license stays
  missing, not null), and model-index only when a whole-split score was recorded."""
  model = card.get("model", {})
  tags = ["hourglass_jax", model.get("kind", "hourglass"), "jax", "flax", "safetensors"]
  if model.get("vocab_size") == 256 and card.get("pipeline_tag") == "text-generation":
    tags.insert(2, "byte-level")
  meta = {"license": card.get("license"), "library_name": card.get("library_name"),
          "pipeline_tag": card.get("pipeline_tag"), "tags": tags, "datasets": card.get("datasets") or None}
  scored = [entry for entry in card.get("model-index") or [] if entry.get("results")]
  if scored:
    meta["model-index"] = scored
  return {key: value for key, value in meta.items() if value is not None}


def readme(card: dict) -> str:
  """README.md: the front matter between '---' lines, then the body."""
  head = yaml.safe_dump(front_matter(card), sort_keys=False, allow_unicode=True, width=1000)
  return f"---\n{head}---\n\n{_body(card)}"


def _title(card: dict) -> str:
  model = card.get("model", {})
  shape = model.get("hierarchy", "") if model.get("kind") in ("hourglass", "vanilla", "retina") else model.get("scales")
  step = card.get("step")
  return f"hourglass_jax {model.get('kind', 'hourglass')} {shape}" + (f", step {step:,}" if step is not None else "")


def _body(card: dict) -> str:
  model, training = card.get("model", {}), card.get("training") or {}
  images = card.get("pipeline_tag") != "text-generation"
  unit = "dim" if images else "byte"
  parts = [f"# {_title(card)}", "",
           f"A {'pixel' if images else 'byte'}-level {model.get('kind', 'hourglass')} model of "
           f"{card.get('num_params', 0):,} parameters (d_model {model.get('d_model')}, {model.get('num_heads')} "
           f"heads, d_ff {model.get('d_ff')}), stored as {card.get('weights_dtype')} safetensors; exported by "
           f"hourglass_jax {card.get('hourglass_jax_version')}.", "", "## Usage", "",
           "With hourglass_jax installed (`pip install hourglass-jax`), from this folder:", "", "```bash",
           ("hourglass-sample --workdir=. --num_samples=4 --output=samples.png" if images else
            "hourglass-sample --workdir=. --prompt='The ' --temperature=0.8"), "```", "", "```python",
           "import jax.numpy as jnp", "from hourglass_jax.model.decode import sampling",
           "from hourglass_jax.weights import load_params", "",
           'loaded = load_params(".")  # checks every array against config.json\'s checksums',
           *(["tokens = sampling.generate(loaded.params, loaded.cfg, jnp.zeros((1, 1), jnp.int32), "
              "max_new_tokens=64, rng=0)  # start token 0"] if images else
             ['prompt = jnp.asarray([list(b"The ")], jnp.int32)',
              "tokens = sampling.generate(loaded.params, loaded.cfg, prompt, max_new_tokens=64, rng=0, "
              "temperature=0.8)"]),
           "```", "", "## Training data", "", _data(card), "", "## Training recipe", "", *_recipe(card, training),
           "", "## Evaluation", "", *_scores(card, unit), "", "## Limitations", "", _limits(card, training, images),
           ""]
  return "\n".join(parts)


def _data(card: dict) -> str:
  training = card.get("training") or {}
  name, source = training.get("dataset"), training.get("source")
  if not name:
    return "The training data was not recorded."
  try:
    about = catalog.spec(name).about
  except ValueError:
    about = ""
  where = f" (`{source}`)" if source else ""
  hub = ", on the Hub as " + ", ".join(f"[{d}](https://huggingface.co/datasets/{d})" for d in card["datasets"]) \
      if card.get("datasets") else ""
  return f"`{name}`{where}{hub}: {about or 'see hourglass_jax docs/data.md.'} Split 90/5/5 (train / valid / test)."


def _recipe(card: dict, training: dict) -> list[str]:
  model, recipe = card.get("model", {}), training.get("recipe") or {}
  tokens = training.get("tokens_seen")
  rows = [("steps", training.get("steps")), ("tokens seen", f"{tokens:,}" if isinstance(tokens, int) else tokens),
          ("batch x length", f"{training.get('batch_size')} x {training.get('seq_len')}"
           if training.get("batch_size") else None),
          ("optimizer", _filled("AdamW (b1 {b1}, b2 {b2}, eps {eps}, weight decay {weight_decay}), gradient "
                                "clipping at global norm {grad_clip_norm}", recipe)),
          ("learning rate", _filled("{learning_rate:g}, {schedule} after {warmup_steps:,} warmup steps", recipe)),
          ("model", f"`{model.get('hierarchy')}`, shorten {model.get('shorten')}, upsample {model.get('upsample')}, "
                    f"positions {model.get('position')}" if model.get("kind") == "hourglass" else model.get("kind")),
          ("dropout", model.get("dropout")), ("compute dtype", model.get("dtype"))]
  return ["| setting | value |", "|---|---|", *(f"| {name} | {_NOT_RECORDED if value is None else value} |"
                                                for name, value in rows),
          "", "Every model setting is in `config.json` (`model`)."]


def _filled(template: str, values: dict) -> str | None:
  """`template` filled from `values`, None where one it names was not recorded."""
  try:
    return template.format(**values)
  except (KeyError, TypeError, ValueError):
    return None


def _scores(card: dict, unit: str) -> list[str]:
  rows = [(result["dataset"]["split"], metric["value"]) for entry in card.get("model-index") or []
          for result in entry.get("results", []) for metric in result.get("metrics", [])]
  if not rows:
    return ["No whole-split score was recorded for this step (`hourglass-eval` records one; export again after it)."]
  return [f"Bits per {unit} over the whole split (hourglass-eval):", "", f"| split | bits/{unit} |", "|---|---:|",
          *(f"| {split} | {value:.4f} |" for split, value in rows)]


def _limits(card: dict, training: dict, images: bool) -> str:
  length = card.get("seq_len") or training.get("seq_len")
  text = [card.get("intended_use") or "Research use.",
          f"It was trained on windows of {length:,} {'values' if images else 'bytes'}; longer contexts extrapolate."
          if length else "",
          "It imitates the style of its training data; what it writes is not reliable as fact."
          if not images else "",
          "No license is stated: the weights' terms are the uploader's to give, and the training data's terms may "
          "restrict them." if not card.get("license") else ""]
  return " ".join(part for part in text if part)
