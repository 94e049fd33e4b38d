"""Serve an exported ONNX model with Ray Serve, batching requests along axis 0 as Triton does.

    python samples/serve_ray.py models/classifier/1/model.onnx --port 8000

The model is one that hlo2onnx or mnjit exported with a symbolic batch (docs/deploy.md); a Triton
repository's `1/model.onnx` folder (a model with external data) works too. Requests and answers use the
Open Inference Protocol's JSON, as Triton and KServe speak it:

    curl -s 127.0.0.1:8000/v2/models/classifier/infer -d '{"inputs": [{"name": "x", "shape": [1, 16],
         "datatype": "FP32", "data": [...]}]}'
    curl -s 127.0.0.1:8000/v2/health/ready          # also /v2/health/live, /v2/models/classifier(/ready)

`@serve.batch` gathers concurrent requests into one ONNX Runtime run of at most --max-batch-size rows, made
with mnjit's session settings (mnjit.runtime.session_options). Ray runs on this machine only (127.0.0.1, no
dashboard, --num-cpus CPUs); Ctrl-C or SIGTERM shuts it down. Needs `pip install -e '.[ray]'` from mnjit's checkout.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading

import numpy as np
import onnx
import onnxruntime as ort
import ray
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse

# Open Inference Protocol datatype <-> numpy (the protocol's tensor types; BYTES is left out).
DATATYPES = {"BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
             "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
             "FP16": np.float16, "FP32": np.float32, "FP64": np.float64}
DATATYPE_OF = {np.dtype(t): name for name, t in DATATYPES.items()}


def model_file(path: str) -> str:
    """The .onnx file: `path` itself, or the model.onnx inside Triton's folder layout for external data."""
    return os.path.join(path, "model.onnx") if os.path.isdir(path) else path


class BadRequest(ValueError):
    pass


def parse_body(raw: bytes) -> dict:
    """The request's JSON object, or BadRequest saying what is wrong with the body."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"the request body is not JSON ({e}): send the Open Inference Protocol's "
                         '{"inputs": [{"name", "shape", "datatype", "data"}, ...]}') from None
    if not isinstance(body, dict):
        raise BadRequest(f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def tensor_metadata(value: onnx.ValueInfoProto) -> dict:
    """An input's or output's Open Inference Protocol metadata: -1 for a symbolic dim."""
    dtype, dims = input_spec(value)
    return {"name": value.name, "datatype": DATATYPE_OF.get(dtype, str(dtype)),
            "shape": [-1 if d is None else d for d in dims]}


def model_metadata(name: str, graph: onnx.GraphProto) -> dict:
    """GET /v2/models/{name}: the model's name, platform, and its inputs and outputs."""
    return {"name": name, "versions": ["1"], "platform": "onnxruntime_onnx",
            "inputs": [tensor_metadata(v) for v in graph.input],
            "outputs": [tensor_metadata(v) for v in graph.output]}


def route(method: str, path: str, name: str, metadata: dict) -> tuple[int, dict] | None:
    """The answer to a request of the Open Inference Protocol's other routes (health, metadata, readiness),
    or None for an inference request, which the caller runs."""
    path = path.rstrip("/")
    model = f"/v2/models/{name}"
    if method == "GET" and path == "/v2/health/live":
        return 200, {"live": True}
    if method == "GET" and path in ("/v2/health/ready", f"{model}/ready"):
        return 200, {"ready": True}
    if method == "GET" and path == model:
        return 200, metadata
    if method == "POST" and path == f"{model}/infer":
        return None
    return 404, {"error": f"no route {method} {path}: this server answers GET /v2/health/live, GET "
                          f"/v2/health/ready, GET {model}, GET {model}/ready and POST {model}/infer"}


def input_spec(value: onnx.ValueInfoProto) -> tuple[np.dtype, list[int | None]]:
    """An input's dtype and dims (None: symbolic)."""
    tensor_type = value.type.tensor_type
    return (np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)),
            [d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim])


def parse_request(body: dict, inputs: dict[str, tuple[np.dtype, list[int | None]]],
                  max_batch_size: int) -> dict[str, np.ndarray]:
    """The request's tensors, checked against the model's inputs: the datatype, numbers of that kind in its
    range, the rank and fixed dims, and 1 to max_batch_size rows, the same number for every input. A request
    the model cannot run must be refused here: joined into a batch, it would fail the other requests there."""
    feeds = {}
    for tensor in body["inputs"]:
        name = tensor["name"]
        if name not in inputs:
            raise BadRequest(f"unknown input {name!r}; the model takes {sorted(inputs)}")
        dtype, dims = inputs[name]
        if DATATYPES.get(tensor["datatype"]) != dtype:
            raise BadRequest(f"input {name!r} must be {DATATYPE_OF[dtype]}")
        shape = tensor["shape"]
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise BadRequest(f"input {name!r}: the shape must be a list of sizes, got {shape!r}")
        if len(shape) != len(dims) or any(d is not None and d != n for d, n in zip(dims[1:], shape[1:])):
            wanted = ", ".join("batch" if d is None else str(d) for d in dims)
            raise BadRequest(f"input {name!r} must have the shape [{wanted}], got {shape}")
        feeds[name] = _numbers(name, tensor["data"], dtype).reshape(shape)
    if set(feeds) != set(inputs):
        raise BadRequest(f"missing inputs {sorted(set(inputs) - set(feeds))}")
    rows = {len(a) if a.ndim else 0 for a in feeds.values()}
    if len(rows) != 1 or not 1 <= min(rows) <= max_batch_size:
        raise BadRequest(f"every input needs the same batch of 1 to {max_batch_size} rows on axis 0")
    return feeds


def _numbers(name: str, data, dtype: np.dtype) -> np.ndarray:
    """`data` as `dtype`, refused where numpy would cast it silently (1.5 to an INT32 as 1) or overflow."""
    given = np.asarray(data)
    if given.size == 0:
        return given.astype(dtype)
    if given.dtype.kind not in "biuf" or not np.can_cast(given.dtype, dtype, "same_kind"):
        raise BadRequest(f"input {name!r} takes {DATATYPE_OF[dtype]} data, got {given.dtype.name} values")
    array = given.astype(dtype)
    if dtype.kind in "iu" and not np.array_equal(array, given):
        raise BadRequest(f"input {name!r}: values out of the range of {DATATYPE_OF[dtype]}")
    return array


@serve.deployment(ray_actor_options={"num_cpus": 1})
class OnnxModel:
    def __init__(self, path: str, name: str, max_batch_size: int, batch_wait_timeout_s: float):
        # Imported here, in the replica: the driver has no use for jax, which must not be loaded when Ray forks.
        from mnjit.runtime import session_options

        self.name = name
        self.max_batch_size = max_batch_size
        self.session = ort.InferenceSession(path, session_options(), providers=["CPUExecutionProvider"])
        graph = onnx.load(path, load_external_data=False).graph
        self.inputs = {i.name: input_spec(i) for i in graph.input}
        self.outputs = [o.name for o in graph.output]
        self.metadata = model_metadata(name, graph)
        self.infer.set_max_batch_size(max_batch_size)
        self.infer.set_batch_wait_timeout_s(batch_wait_timeout_s)

    async def __call__(self, request: Request) -> JSONResponse:
        answer = route(request.method, request.url.path, self.name, self.metadata)
        if answer is not None:
            return JSONResponse(answer[1], status_code=answer[0])
        try:
            feeds = self.parse(parse_body(await request.body()))
        except (BadRequest, ValueError, TypeError, KeyError) as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        outputs = await self.infer(feeds)
        return JSONResponse({"model_name": self.name, "outputs": [
            {"name": name, "shape": list(value.shape), "datatype": DATATYPE_OF[value.dtype],
             "data": value.ravel().tolist()} for name, value in zip(self.outputs, outputs)]})

    def parse(self, body: dict) -> dict[str, np.ndarray]:
        return parse_request(body, self.inputs, self.max_batch_size)

    # Batches count rows, not requests (batch_size_fn, Ray >= 2.53): one run never passes max_batch_size rows.
    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.005,
                 batch_size_fn=lambda requests: sum(len(next(iter(feeds.values()))) for feeds in requests))
    async def infer(self, requests: list[dict[str, np.ndarray]]) -> list[list[np.ndarray]]:
        joined = {name: np.concatenate([feeds[name] for feeds in requests]) for name in self.inputs}
        outputs = self.session.run(self.outputs, joined)
        cuts = np.cumsum([len(next(iter(feeds.values()))) for feeds in requests])[:-1]
        return [list(parts) for parts in zip(*(np.split(value, cuts) for value in outputs))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="the .onnx file (or Triton's model.onnx/ folder)")
    parser.add_argument("--name", help="the model's name in request URLs (default: the file's graph name)")
    parser.add_argument("--port", type=int, default=8000, help="the HTTP port on 127.0.0.1 (default 8000)")
    parser.add_argument("--max-batch-size", type=int, default=32, help="rows per ONNX Runtime run (default 32)")
    parser.add_argument("--batch-wait-ms", type=float, default=5.0,
                        help="how long a request waits for others to join its batch (default 5 ms)")
    parser.add_argument("--num-cpus", type=int, default=2, help="CPUs Ray may use (default 2)")
    args = parser.parse_args(argv)
    path = model_file(args.model)
    name = args.name or onnx.load(path, load_external_data=False).graph.name or "model"

    ray.init(num_cpus=args.num_cpus, include_dashboard=False, object_store_memory=100 * 2**20,
             log_to_driver=False, configure_logging=False)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": args.port})
        app = OnnxModel.bind(os.path.abspath(path), name, args.max_batch_size, args.batch_wait_ms / 1000)
        # The whole protocol, health routes included (/v2/health/...), goes to the one deployment.
        serve.run(app, name=name, route_prefix="/")
        print(f"serving {name} at http://127.0.0.1:{args.port}/v2/models/{name}/infer", flush=True)
        stop.wait()
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
