"""The kernels of a compiled XLA:GPU program, read from its optimized HLO text, and a roofline estimate of each.

`kernels(hlo_text)` walks the entry computation, descending into while bodies (times their known trip count),
calls and conditionals, and lists every instruction that launches work on the device: fusions (cuBLAS / Triton
GEMM fusions, loop and reduction fusions), custom calls (cuBLAS, cuDNN, Pallas / Triton kernels), copies. Each
gets a class (`CLASSES`), its bytes read and written (operands + outputs, a dynamically sliced operand counted at
its slice, an in-place update at the update) and its matmul FLOPs (2 x output x contracted size of each dot).

`roofline(kernels, gpu, launch_s=...)` gives each kernel max(FLOPs / peak, bytes / bandwidth) at the peaks of `GPUS`
(published bf16 dense tensor-core peak and HBM bandwidth), plus `launch_s` per launch: a lower bound of the step
for a program whose every kernel ran at its roofline. The launch cost is not a published figure: it is fitted to
measured steps (benchmarks/gpu_calibration.py). No jax here: the text is all it reads.
"""

import json
import math
import re

# Published peaks: NVIDIA H100 SXM5 and H200 SXM datasheets (bf16 dense tensor core 989.4 TFLOP/s; HBM3 3.35 TB/s,
# HBM3e 4.8 TB/s); SFU exp2 throughput 3.9 T/s (FlashAttention-3, Shah et al. 2024, sec. 3.1, for the H100 SXM5);
# 32-bit integer lanes: 64 per SM per clock (Hopper tuning guide) at the 1.98 GHz boost clock, 132 SMs.
GPUS = {
    "h100": dict(name="NVIDIA H100 80GB HBM3", bf16_flops=989.4e12, hbm_bytes_per_s=3.35e12, exp_per_s=3.9e12,
                 int_ops_per_s=132 * 64 * 1.98e9, memory_bytes=80 * 2**30),
    "h200": dict(name="NVIDIA H200", bf16_flops=989.4e12, hbm_bytes_per_s=4.8e12, exp_per_s=3.9e12,
                 int_ops_per_s=132 * 64 * 1.98e9, memory_bytes=141 * 10**9),
}
CLASSES = ("matmul", "attention", "elementwise", "reduction", "copy", "other")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
          "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1, "s4": 0.5, "u4": 0.5}
_ARRAY = re.compile(r"\b(" + "|".join(_BYTES) + r")\[([0-9,]*)\]")
_HEADER = re.compile(r"^(ENTRY )?%(\S+) \(.*\) -> .*\{$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(\S+) = (.*)$")
_FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "opt-barrier",
         "add-dependency", "partition-id", "replica-id", "fusion-done", "copy-done", "async-done", "domain",
         "send-done", "recv-done", "all-reduce-done", "all-gather-done", "collective-permute-done"}
_MOVES = {"parameter", "constant", "bitcast", "reshape", "transpose", "copy", "broadcast", "slice", "dynamic-slice",
          "dynamic-update-slice", "concatenate", "pad", "tuple", "get-tuple-element", "iota", "reverse"}


def arrays(type_text: str) -> list[tuple[str, tuple[int, ...]]]:
  """(dtype, dims) of every array in an HLO type (a tuple type gives several)."""
  return [(dtype, tuple(int(d) for d in dims.split(",") if d)) for dtype, dims in _ARRAY.findall(type_text)]


def nbytes(type_text: str) -> int:
  return int(sum(_BYTES[dtype] * math.prod(dims) for dtype, dims in arrays(type_text)))


def _balanced(text: str, start: int) -> int:
  """Index just past the bracket group opening at text[start]."""
  depth, pairs = 0, {"(": ")", "{": "}", "[": "]"}
  closing = pairs[text[start]]
  opening = text[start]
  for i in range(start, len(text)):
    if text[i] == opening:
      depth += 1
    elif text[i] == closing:
      depth -= 1
      if depth == 0:
        return i + 1
  return len(text)


class Instruction:
  """One HLO instruction: name, type text, opcode, operand names, the rest (attributes)."""

  def __init__(self, name: str, rest: str):
    self.name = name
    end = _balanced(rest, 0) if rest.startswith("(") else rest.index(" ")
    self.type = rest[:end]
    after = rest[end:].lstrip()
    self.opcode = after[:after.index("(")]
    open_at = after.index("(")
    close = _balanced(after, open_at)
    self.args = after[open_at + 1:close - 1]
    self.operands = re.findall(r"%([^\s,)]+)", self.args)
    self.attrs = after[close:]

  def attr(self, key: str) -> str | None:
    match = re.search(r"\b" + key + r"=(%?[^,\s]+)", self.attrs)
    return match[1].lstrip("%") if match else None

  def op_name(self) -> str:
    match = re.search(r'op_name="([^"]*)"', self.attrs)
    return match[1] if match else ""


def parse(hlo_text: str) -> tuple[dict[str, list[Instruction]], str]:
  """({computation name: instructions}, the entry computation's name)."""
  computations, entry, current = {}, None, None
  for line in hlo_text.splitlines():
    header = _HEADER.match(line)
    if header:
      current = computations.setdefault(header[2], [])
      entry = header[2] if header[1] else entry
      continue
    if line.startswith("}"):
      current = None
      continue
    match = _INSTRUCTION.match(line) if current is not None else None
    if match:
      current.append(Instruction(match[1], match[2]))
  return computations, entry


def _trip_count(instruction: Instruction) -> int:
  match = re.search(r'"known_trip_count":\{"n":"(\d+)"', instruction.attrs)
  return int(match[1]) if match else 1


def _dot_flops(dot: Instruction, shapes: dict[str, str]) -> float:
  """2 x output elements x contracted size of a dot, its lhs shape read from `shapes`."""
  [(_, out)] = arrays(dot.type)[:1] or [("", ())]
  lhs = arrays(shapes.get(dot.operands[0], ""))
  dims = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", dot.attrs)
  if not lhs or not dims:
    return 0.0
  contracted = math.prod(lhs[0][1][int(d)] for d in dims[1].split(",") if d)
  return 2.0 * math.prod(out) * contracted


def _custom_call_flops(call: Instruction, shapes: dict[str, str]) -> float:
  """cuBLAS GEMM custom calls: their contracting dimensions are in the backend config."""
  dims = re.search(r'"lhs_contracting_dimensions":\[([^\]]*)\]', call.attrs)
  lhs = arrays(shapes.get(call.operands[0], "")) if call.operands else []
  out = arrays(call.type)
  if not dims or not lhs or not out:
    return 0.0
  contracted = math.prod(lhs[0][1][int(d.strip('"'))] for d in dims[1].split(",") if d.strip('"'))
  return 2.0 * math.prod(out[0][1]) * contracted


def _fusion_facts(fused: list[Instruction]) -> dict:
  """What a fused computation does: its dots' FLOPs, reductions, whether it only moves data, and the bytes its
  parameters really read (a parameter read only through dynamic-slice counts at the slices' size)."""
  shapes = {i.name: i.type for i in fused}
  users = {}
  for i in fused:
    for operand in i.operands:
      users.setdefault(operand, []).append(i)
  params = {}
  for i in fused:
    if i.opcode == "parameter":
      index = int(i.args)
      uses = users.get(i.name, [])
      sliced = uses and all(u.opcode == "dynamic-slice" and u.operands[0] == i.name for u in uses)
      params[index] = sum(nbytes(u.type) for u in uses) if sliced else nbytes(i.type)
  root = fused[-1] if fused else None
  in_place = root is not None and root.opcode == "dynamic-update-slice"
  return dict(flops=sum(_dot_flops(i, shapes) for i in fused if i.opcode == "dot"),
              dots=sum(i.opcode == "dot" for i in fused), reduces=any(i.opcode in ("reduce", "reduce-window")
                                                                        for i in fused),
              moves_only=all(i.opcode in _MOVES for i in fused), params=params,
              update_bytes=nbytes(shapes.get(root.operands[1], "")) if in_place else None)


def kernels(hlo_text: str) -> list[dict]:
  """Every kernel launch of one execution of the program: name, class, count (launches, with loop trip counts),
  bytes and FLOPs per launch, op_name (the JAX source), and `kernel` (the Pallas name or custom-call target)."""
  computations, entry = parse(hlo_text)
  facts_cache = {}
  out = []

  def facts(name):
    if name not in facts_cache:
      facts_cache[name] = _fusion_facts(computations.get(name, []))
    return facts_cache[name]

  def walk(name: str, times: float):
    body = computations.get(name, [])
    shapes = {i.name: i.type for i in body}
    for i in body:
      if i.opcode in _FREE:
        continue
      if i.opcode == "while":
        n = _trip_count(i)
        walk(i.attr("body"), times * n)
        walk(i.attr("condition"), times * (n + 1))
        continue
      if i.opcode in ("call", "async-start"):
        walk(i.attr("to_apply") or i.attr("calls"), times)
        continue
      if i.opcode == "conditional":
        branches = re.findall(r"%([^\s,}]+)", (re.search(r"branch_computations=\{([^}]*)\}", i.attrs) or [""])[0])
        for branch in branches:
          walk(branch, times / max(1, len(branches)))
        continue
      out.append(_kernel(i, shapes, facts, times))

  walk(entry, 1.0)
  return out


def _kernel(i: Instruction, shapes: dict[str, str], facts, times: float) -> dict:
  operand_bytes = [nbytes(shapes.get(o, "")) for o in i.operands]
  out_bytes = nbytes(i.type.split("), ")[-1] if i.opcode == "fusion-start" else i.type)
  flops, kind, label = 0.0, "other", i.opcode
  if i.opcode in ("fusion", "fusion-start"):
    called = i.attr("calls")
    f = facts(called)
    operand_bytes = [f["params"].get(k, b) for k, b in enumerate(operand_bytes)]
    if f["update_bytes"] is not None:  # in place: reads and writes the update only
      operand_bytes, out_bytes = [b for k, b in enumerate(operand_bytes) if k != 0], f["update_bytes"]
    flops = f["flops"]
    fusion_kind = i.attr("kind") or ""
    kind = ("matmul" if f["dots"] else "copy" if f["moves_only"] else
            "reduction" if f["reduces"] or fusion_kind == "kInput" else "elementwise")
    label = f"fusion {fusion_kind}"
  elif i.opcode == "custom-call":
    target = (re.search(r'custom_call_target="([^"]*)"', i.attrs) or [None, ""])[1]
    op_name = i.op_name()
    pallas = re.search(r"/(\w+)/pallas_call", op_name)
    label = pallas[1] if pallas else target
    if "fmha" in target or (pallas and "flash" in pallas[1]):
      kind = "attention"
    elif "gemm" in target or "matmul" in target or "cublas" in target:
      kind, flops = "matmul", _custom_call_flops(i, shapes)
    constraints = re.search(r"operand_layout_constraints=\{(.*?)\}, (?:api_version|metadata)", i.attrs)
    operand_types = [m[0] for m in _ARRAY.finditer(constraints[1])] if constraints else []
    return dict(name=i.name, kind=kind, label=label, count=times, flops=flops, operand_types=operand_types,
                bytes=float(sum(operand_bytes) + out_bytes), op_name=i.op_name())
  elif i.opcode in ("dot", "convolution"):
    kind, flops = "matmul", _dot_flops(i, shapes)
  elif i.opcode in ("copy", "copy-start", "transpose", "dynamic-update-slice", "dynamic-slice", "concatenate", "pad"):
    kind = "copy"
  elif i.opcode in ("reduce", "reduce-window"):
    kind = "reduction"
  return dict(name=i.name, kind=kind, label=label, count=times, flops=flops,
              bytes=float(sum(operand_bytes) + out_bytes), op_name=i.op_name())


def seconds(kernel: dict, gpu: dict, extra=None, launch_s: float = 0.0) -> float:
  """One launch's roofline time on `gpu` (a `GPUS` entry): the slowest of its tensor-core FLOPs, its HBM bytes and
  `extra(kernel, gpu)` (non-tensor-core work, e.g. attention's exp2 and dropout hash), plus `launch_s`."""
  return max(kernel["flops"] / gpu["bf16_flops"], kernel["bytes"] / gpu["hbm_bytes_per_s"],
             extra(kernel, gpu) if extra else 0.0) + launch_s


def roofline(kernel_list: list[dict], gpu: dict, extra=None, launch_s: float = 0.0) -> dict:
  """Per class: launches, FLOPs, bytes and roofline seconds (+ `launch_s` per launch) of one step on `gpu`, and
  their totals."""
  by_class = {k: dict(launches=0.0, flops=0.0, bytes=0.0, seconds=0.0) for k in CLASSES}
  for k in kernel_list:
    time_s = seconds(k, gpu, extra, launch_s)
    row = by_class[k["kind"]]
    row["launches"] += k["count"]
    row["flops"] += k["flops"] * k["count"]
    row["bytes"] += k["bytes"] * k["count"]
    row["seconds"] += time_s * k["count"]
  total = {key: sum(row[key] for row in by_class.values()) for key in ("launches", "flops", "bytes", "seconds")}
  return dict(classes=by_class, total=total)


def top(kernel_list: list[dict], gpu: dict, n: int = 12, extra=None, launch_s: float = 0.0) -> list[dict]:
  """The n kernels (same label and source merged) with the largest roofline time (+ `launch_s` per launch) per
  step on `gpu`."""
  merged = {}
  for k in kernel_list:
    key = (k["kind"], k["label"], _short_source(k["op_name"]))
    row = merged.setdefault(key, dict(kind=key[0], label=key[1], source=key[2], launches=0.0, seconds=0.0,
                                      flops=0.0, bytes=0.0))
    row["launches"] += k["count"]
    row["seconds"] += seconds(k, gpu, extra, launch_s) * k["count"]
    row["flops"] += k["flops"] * k["count"]
    row["bytes"] += k["bytes"] * k["count"]
  return sorted(merged.values(), key=lambda r: -r["seconds"])[:n]


def _short_source(op_name: str) -> str:
  """The JAX source path of an op without jit / jvp / transpose wrappers: 'body/inner/.../mlp/wi/dot_general'."""
  text = re.sub(r"jit\(\w+\)/|transpose\(|jvp\(|\)|eval_jaxpr/|while/body/|checkpoint/|remat/", "", op_name)
  return text[-90:]


def summary(kernel_list: list[dict]) -> dict:
  """Launch counts per class and per launch label (fusion kinds, custom-call targets, Pallas kernels)."""
  labels = {}
  for k in kernel_list:
    labels[k["label"]] = labels.get(k["label"], 0) + k["count"]
  return dict(launches_per_step=sum(k["count"] for k in kernel_list), distinct_kernels=len(kernel_list),
              labels=dict(sorted(labels.items(), key=lambda kv: -kv[1])))


def dumps(obj) -> str:
  return json.dumps(obj, indent=1)
