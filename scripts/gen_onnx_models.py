#!/usr/bin/env python3
"""Generates the ONNX example models and test graphs, deterministically.

Usage: .venv/bin/python scripts/gen_onnx_models.py [--check]

Writes (relative to the repository root):
  models/simple_onnx/1/model.onnx + config.pbtxt   the `simple` contract via ONNX Runtime
  models/mlp_onnx/1/model.onnx + config.pbtxt      FP32 MLP 256 -> 1024 -> 768 -> 256, no batcher
  models/mlp_onnx_dyna/1/model.onnx + config.pbtxt same graph, dynamic batcher
  models/sequence_accumulator_onnx/1/model.onnx + config.pbtxt
      implicit-state accumulator without initial state (sequence batcher, direct strategy):
      controls START/READY (INT32), state INPUT_STATE -> OUTPUT_STATE (INT32 [1]);
      OUTPUT_STATE = READY ? (START ? INPUT : INPUT + INPUT_STATE) : INPUT_STATE; OUTPUT = OUTPUT_STATE
  models/sequence_accumulator_onnx_init/1/model.onnx + config.pbtxt
      OUTPUT_STATE = OUTPUT = INPUT + INPUT_STATE, no controls; zero initial state, variable state
      dims [-1] (oldest strategy)
  models/sequence_accumulator_onnx_file/1/model.onnx + config.pbtxt + initial_state/initial_state_data
      the same sum with the initial state read from a file (one INT32 = 100, so a sequence's first
      OUTPUT is INPUT + 100); fixed state dims [1]; OUTPUT_STATE also listed as a config output so
      clients may request it (direct strategy)
  tests/data/identity_all_types.onnx               Identity per KServe datatype (backend tests)

Every file is a pure function of this script (fixed seeds, fixed producer
fields), so rerunning it leaves `git status` clean. `--check` regenerates in
memory and exits non-zero if a committed file differs.
"""
import pathlib
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = pathlib.Path(__file__).resolve().parent.parent
# ORT 1.32 runs opset 17 and IR 8 fine, and older runtimes (Triton's) do too.
OPSET = 17
IR_VERSION = 8


def finish(graph):
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="shardserve-gen_onnx_models",
        producer_version="1",
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model.SerializeToString(deterministic=True)


def simple():
    io = lambda name: helper.make_tensor_value_info(name, TensorProto.INT32, ["batch", 16])
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"], name="add"),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"], name="sub"),
        ],
        "simple_onnx",
        [io("INPUT0"), io("INPUT1")],
        [io("OUTPUT0"), io("OUTPUT1")],
    )
    return finish(graph)


MLP_SIZES = [256, 1024, 768, 256]


def mlp():
    # Big enough (about 1.2 M weights, 2.5 MFLOP per row) that one execution
    # costs far more than the server's per-request overhead, so batching shows.
    rng = np.random.default_rng(20240501)
    nodes, inits = [], []
    prev = "INPUT0"
    layers = len(MLP_SIZES) - 1
    for i, (n_in, n_out) in enumerate(zip(MLP_SIZES, MLP_SIZES[1:])):
        # He initialisation keeps activations O(1) through the Relus.
        w = (rng.standard_normal((n_in, n_out)) * np.sqrt(2.0 / n_in)).astype(np.float32)
        b = (rng.standard_normal(n_out) * 0.01).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        out = "OUTPUT0" if i == layers - 1 else f"h{i}"
        gemm_out = out if i == layers - 1 else f"g{i}"
        nodes.append(helper.make_node("Gemm", [prev, f"w{i}", f"b{i}"], [gemm_out], name=f"dense{i}"))
        if i != layers - 1:
            nodes.append(helper.make_node("Relu", [gemm_out], [out], name=f"relu{i}"))
        prev = out
    graph = helper.make_graph(
        nodes,
        "mlp_onnx",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", MLP_SIZES[0]])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", MLP_SIZES[-1]])],
        inits,
    )
    return finish(graph)


# KServe datatype name -> ONNX element type; the tensor names are IN_<name> / OUT_<name>.
ALL_TYPES = [
    ("BOOL", TensorProto.BOOL),
    ("INT8", TensorProto.INT8),
    ("INT16", TensorProto.INT16),
    ("INT32", TensorProto.INT32),
    ("INT64", TensorProto.INT64),
    ("UINT8", TensorProto.UINT8),
    ("UINT16", TensorProto.UINT16),
    ("UINT32", TensorProto.UINT32),
    ("UINT64", TensorProto.UINT64),
    ("FP16", TensorProto.FLOAT16),
    ("FP32", TensorProto.FLOAT),
    ("FP64", TensorProto.DOUBLE),
    ("BF16", TensorProto.BFLOAT16),
    ("BYTES", TensorProto.STRING),
]


def identity_all_types():
    nodes, inputs, outputs = [], [], []
    for name, ty in ALL_TYPES:
        inputs.append(helper.make_tensor_value_info(f"IN_{name}", ty, ["batch", "n"]))
        outputs.append(helper.make_tensor_value_info(f"OUT_{name}", ty, ["batch", "n"]))
        nodes.append(helper.make_node("Identity", [f"IN_{name}"], [f"OUT_{name}"], name=f"id_{name}"))
    return finish(helper.make_graph(nodes, "identity_all_types", inputs, outputs))


# ---- implicit-state (sequence batcher) accumulators, after Triton QA's
# gen_qa_implicit_models.py: the server keeps OUTPUT_STATE between the
# requests of a sequence and feeds it back as INPUT_STATE. ----


def accumulator_without_initial_state():
    # A start request gets whatever the batcher puts in INPUT_STATE, so the
    # graph itself restarts the sum on START; a row that is not READY (an
    # empty batch slot under the direct strategy) keeps its state.
    i32 = lambda name: helper.make_tensor_value_info(name, TensorProto.INT32, ["batch", 1])
    nodes = [
        helper.make_node("Add", ["INPUT", "INPUT_STATE"], ["sum"], name="add"),
        helper.make_node("Cast", ["START"], ["start"], name="start_bool", to=TensorProto.BOOL),
        helper.make_node("Cast", ["READY"], ["ready"], name="ready_bool", to=TensorProto.BOOL),
        helper.make_node("Where", ["start", "INPUT", "sum"], ["next"], name="restart"),
        helper.make_node("Where", ["ready", "next", "INPUT_STATE"], ["OUTPUT_STATE"], name="keep"),
        helper.make_node("Identity", ["OUTPUT_STATE"], ["OUTPUT"], name="output"),
    ]
    graph = helper.make_graph(
        nodes,
        "sequence_accumulator_onnx",
        [i32("INPUT"), i32("START"), i32("READY"), i32("INPUT_STATE")],
        [i32("OUTPUT"), i32("OUTPUT_STATE")],
    )
    return finish(graph)


def accumulator_with_initial_state(name, state_dim):
    # The initial state (zeros or a file) makes a sequence's first request
    # correct without a START control. `state_dim` is the state's dim after
    # the batch dim: a symbol when the config's state dims are variable.
    io = lambda n, dims: helper.make_tensor_value_info(n, TensorProto.INT32, ["batch"] + dims)
    nodes = [
        helper.make_node("Add", ["INPUT", "INPUT_STATE"], ["OUTPUT_STATE"], name="add"),
        helper.make_node("Identity", ["OUTPUT_STATE"], ["OUTPUT"], name="output"),
    ]
    graph = helper.make_graph(
        nodes,
        name,
        [io("INPUT", [1]), io("INPUT_STATE", [state_dim])],
        [io("OUTPUT", [state_dim]), io("OUTPUT_STATE", [state_dim])],
    )
    return finish(graph)


def sequence_config(name, comment, state_dims, initial_state, strategy, controls=True, state_output=False):
    control = lambda n, kind: f"""    {{
      name: "{n}"
      control [ {{ kind: {kind}, int32_false_true: [ 0, 1 ] }} ]
    }}"""
    control_block = ""
    if controls:
        control_block = (
            "  control_input [\n"
            + control("START", "CONTROL_SEQUENCE_START")
            + ",\n"
            + control("READY", "CONTROL_SEQUENCE_READY")
            + "\n  ]\n"
        )
    extra_output = ""
    if state_output:
        extra_output = f""",
  {{
    name: "OUTPUT_STATE"
    data_type: TYPE_INT32
    dims: {state_dims}
  }}"""
    return HEADER + f"""# {comment}
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {{
    name: "INPUT"
    data_type: TYPE_INT32
    dims: [ 1 ]
  }}
]
output [
  {{
    name: "OUTPUT"
    data_type: TYPE_INT32
    dims: {state_dims}
  }}{extra_output}
]
sequence_batching {{
  max_sequence_idle_microseconds: 5000000
  {strategy}
{control_block}  state [
    {{
      input_name: "INPUT_STATE"
      output_name: "OUTPUT_STATE"
      data_type: TYPE_INT32
      dims: {state_dims}{initial_state}
    }}
  ]
}}
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
"""


def initial_state(source):
    return f"""
      initial_state {{
        data_type: TYPE_INT32
        dims: [ 1 ]
        {source}
      }}"""


# The `data_file` of an initial state lives in <model>/initial_state/.
INITIAL_STATE_VALUE = 100


HEADER = "# Generated by scripts/gen_onnx_models.py; edit the script, not this file.\n"

SIMPLE_CONFIG = HEADER + """# The `simple` contract (CONTRACTS.md) through ONNX Runtime.
name: "simple_onnx"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {
    name: "INPUT0"
    data_type: TYPE_INT32
    dims: [ 16 ]
  },
  {
    name: "INPUT1"
    data_type: TYPE_INT32
    dims: [ 16 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_INT32
    dims: [ 16 ]
  },
  {
    name: "OUTPUT1"
    data_type: TYPE_INT32
    dims: [ 16 ]
  }
]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""


def mlp_config(name, comment, extra=""):
    return HEADER + f"""# {comment}
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 64
input [
  {{
    name: "INPUT0"
    data_type: TYPE_FP32
    dims: [ {MLP_SIZES[0]} ]
  }}
]
output [
  {{
    name: "OUTPUT0"
    data_type: TYPE_FP32
    dims: [ {MLP_SIZES[-1]} ]
  }}
]
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
{extra}"""


def outputs():
    mlp_bytes = mlp()
    return {
        "models/simple_onnx/1/model.onnx": simple(),
        "models/simple_onnx/config.pbtxt": SIMPLE_CONFIG.encode(),
        "models/mlp_onnx/1/model.onnx": mlp_bytes,
        "models/mlp_onnx/config.pbtxt": mlp_config(
            "mlp_onnx", "FP32 MLP 256 -> 1024 -> 768 -> 256 (Relu), one request per execution."
        ).encode(),
        # A copy rather than a symlink: repositories get copied around (Docker, archives).
        "models/mlp_onnx_dyna/1/model.onnx": mlp_bytes,
        "models/mlp_onnx_dyna/config.pbtxt": mlp_config(
            "mlp_onnx_dyna",
            "mlp_onnx's graph behind the dynamic batcher, for batching benchmarks.",
            "dynamic_batching {\n  preferred_batch_size: [ 16, 32, 64 ]\n"
            "  max_queue_delay_microseconds: 2000\n}\n",
        ).encode(),
        "models/sequence_accumulator_onnx/1/model.onnx": accumulator_without_initial_state(),
        "models/sequence_accumulator_onnx/config.pbtxt": sequence_config(
            "sequence_accumulator_onnx",
            "Implicit-state accumulator without initial state: START restarts the sum, READY 0 keeps the state.",
            "[ 1 ]",
            "",
            "direct { }",
        ).encode(),
        "models/sequence_accumulator_onnx_init/1/model.onnx": accumulator_with_initial_state(
            "sequence_accumulator_onnx_init", "state"
        ),
        "models/sequence_accumulator_onnx_init/config.pbtxt": sequence_config(
            "sequence_accumulator_onnx_init",
            "Implicit-state accumulator from a zero initial state, variable state dims, oldest strategy.",
            "[ -1 ]",
            initial_state('zero_data: true\n        name: "zero"'),
            "oldest { max_candidate_sequences: 4, max_queue_delay_microseconds: 1000 }",
            controls=False,
        ).encode(),
        "models/sequence_accumulator_onnx_file/1/model.onnx": accumulator_with_initial_state(
            "sequence_accumulator_onnx_file", 1
        ),
        "models/sequence_accumulator_onnx_file/config.pbtxt": sequence_config(
            "sequence_accumulator_onnx_file",
            f"Implicit-state accumulator whose initial state ({INITIAL_STATE_VALUE}) is read from a file; "
            "clients may request OUTPUT_STATE.",
            "[ 1 ]",
            initial_state('data_file: "initial_state_data"\n        name: "from_file"'),
            "direct { }",
            controls=False,
            state_output=True,
        ).encode(),
        "models/sequence_accumulator_onnx_file/initial_state/initial_state_data": np.array(
            [INITIAL_STATE_VALUE], dtype="<i4"
        ).tobytes(),
        "tests/data/identity_all_types.onnx": identity_all_types(),
    }


def main():
    check = "--check" in sys.argv[1:]
    stale = []
    for rel, data in outputs().items():
        path = ROOT / rel
        if check:
            if not path.is_file() or path.read_bytes() != data:
                stale.append(rel)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file() or path.read_bytes() != data:
            path.write_bytes(data)
            print(f"wrote {rel} ({len(data)} bytes)")
    if stale:
        print("out of date: " + ", ".join(stale), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
