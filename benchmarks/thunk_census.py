"""The launches of a compiled XLA:GPU program as its runtime issues them, from the thunk sequence XLA dumps.

XLA:GPU runs a program as a sequence of thunks (kernels, copies, GEMMs, while loops); after the thunk passes,
runs of at least `xla_gpu_graph_min_graph_size` (5) consecutive kernels become command buffers (CUDA graphs),
each launched by the host in one call. `xla_dump_to` writes that sequence (`*.thunk_sequence_after_thunk_passes.txt`,
or `*.thunk_sequence.txt` when no pass changed it) and `*.thunk_metadata.txt` (thunk id -> HLO instruction).
`count(sequence, metadata, hlo_text)` walks it with each while loop's trip count from the optimized HLO and gives
per step: kernels (every kernel or copy the device runs), graph_kernels (those inside command buffers), graphs
(command-buffer launches), host_launches (what the host submits: each graph once, each kernel outside a graph),
loop_iterations (each a condition kernel and a device-to-host copy of its result) and stream_syncs (async
start / done pairs). No jax here: the dumped text is all it reads.
"""

import re

_NODE = re.compile(r"^( *)(\d+): (k\w+)\b(.*)$")
_MARKER = re.compile(r"^( *)(condition|body|branch \d+|branch_\d+):\s*$")
_NESTED = ("kCommandBuffer", "kAsyncStart", "kSequential", "kDynamicSliceFusion", "kWhile", "kConditional")
_NOT_KERNELS = {"kAsyncDone", "kWaitForStreams", "kSequential", "kAsyncStart", "kCommandBuffer", "kWhile",
                "kConditional"}


def parse(sequence: str) -> list[dict]:
  """The thunk tree: each node {kind, id, rest, children}; a while's children are split into `condition` and
  `body`, a conditional's into `branches`."""
  root, containers, last_nested = [], {0: None}, {}
  containers[0] = root
  for line in sequence.splitlines():
    if not line.strip():
      continue
    marker = _MARKER.match(line)
    if marker:
      indent, name = len(marker[1]), marker[2]
      owner = last_nested.get(indent if name == "condition" else indent - 2) or last_nested.get(indent)
      if owner is None:
        continue
      if name == "condition":
        containers[owner["indent"] + 4] = owner["condition"]
      elif name == "body":
        containers[owner["indent"] + 4] = owner["body"]
      else:
        owner["branches"].append([])
        containers[owner["indent"] + 4] = owner["branches"][-1]
      continue
    node = _NODE.match(line)
    if not node:
      continue
    indent = len(node[1])
    entry = dict(kind=node[3], id=int(node[2]), rest=node[4].strip(), indent=indent, children=[], condition=[],
                 body=[], branches=[])
    parent = containers.get(indent)
    if parent is None:  # an indentation the tree has not opened: attach to the nearest shallower container
      parent = containers[max(k for k in containers if k <= indent)]
    parent.append(entry)
    if entry["kind"] in _NESTED:
      containers[indent + 4] = entry["children"]
      last_nested[indent] = entry
  return root


def annotations(metadata: str) -> dict[int, str]:
  """thunk id -> its HLO instruction (profile annotation), from `*.thunk_metadata.txt`."""
  out = {}
  for block in metadata.split("thunk_metadata {")[1:]:
    name = re.search(r'profile_annotation: "([^"]*)"', block)
    thunk = re.search(r"thunk_id: (\d+)", block)
    if name and thunk:
      out[int(thunk[1])] = name[1]
  return out


def trip_counts(hlo_text: str) -> dict[str, int]:
  """While instruction name -> its known trip count, from the optimized HLO."""
  counts = {}
  for match in re.finditer(r"%(\S+) = \([^\n]*? while\([^\n]*?\"known_trip_count\":\{\"n\":\"(\d+)\"", hlo_text):
    counts[match[1]] = int(match[2])
  return counts


def count(sequence: str, metadata: str = "", hlo_text: str = "") -> dict:
  """Per-step launch counts of a dumped thunk sequence (see the module docstring); a while loop whose trip count
  is unknown counts once."""
  names, trips = annotations(metadata), trip_counts(hlo_text)
  totals = dict(kernels=0.0, graph_kernels=0.0, graphs=0.0, host_launches=0.0, loop_iterations=0.0,
                stream_syncs=0.0)

  def walk(nodes, times: float, in_graph: bool):
    for node in nodes:
      kind = node["kind"]
      if kind == "kWhile":
        n = trips.get(names.get(node["id"], ""), 1)
        totals["loop_iterations"] += times * n
        walk(node["condition"], times * (n + 1), in_graph)
        walk(node["body"], times * n, in_graph)
      elif kind == "kConditional":
        for branch in node["branches"]:
          walk(branch, times / max(1, len(node["branches"])), in_graph)
      elif kind == "kCommandBuffer":
        totals["graphs"] += times
        totals["host_launches"] += 0 if in_graph else times
        walk(node["children"], times, True)
      elif kind == "kDynamicSliceFusion":  # one kernel: the copy or fusion it wraps, at offsets it computes
        totals["kernels"] += times
        totals["graph_kernels"] += times if in_graph else 0
        totals["host_launches"] += 0 if in_graph else times
      elif kind in ("kAsyncStart", "kSequential"):
        totals["stream_syncs"] += times if kind == "kAsyncStart" else 0
        walk(node["children"], times, in_graph)
      elif kind not in _NOT_KERNELS:
        totals["kernels"] += times
        totals["graph_kernels"] += times if in_graph else 0
        totals["host_launches"] += 0 if in_graph else times

  walk(parse(sequence), 1.0, False)
  return totals
