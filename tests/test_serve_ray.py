"""samples/serve_ray.py: Ray Serve on 127.0.0.1 answers concurrent requests of 1 to 32 rows as jax.jit does."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np
import pytest

import hlo2onnx
from harness import TOLERANCE
from test_serving import classifier, exported, inputs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(ROOT, "samples", "serve_ray.py")
# Ray starts a whole local cluster: one at a time on this machine, whichever pytest (or xdist worker) asks.
LOCK = os.path.join(tempfile.gettempdir(), "mnjit-test-ray-serve.lock")
BATCHES = [1, 2, 3, 5, 7, 8, 13, 16, 21, 32] * 2
START_SECONDS, STOP_SECONDS = 90, 60

pytestmark = pytest.mark.xdist_group("ray")


@contextlib.contextmanager
def one_ray_cluster_at_a_time():
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_line(process: subprocess.Popen, prefix: str, seconds: float, log) -> str:
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if selector.select(timeout=1):
            line = process.stdout.readline()
            if line.startswith(prefix):
                return line
            if not line:  # the sample ended
                break
    pytest.fail(f"the sample did not start (exit status {process.poll()}):\n{log.read_text()[-4000:]}")


def infer(url: str, x: np.ndarray, label: np.ndarray) -> dict[str, np.ndarray]:
    body = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()},
                       {"name": "label", "shape": list(label.shape), "datatype": "INT32", "data": label.tolist()}]}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        answer = json.load(response)
    return {o["name"]: np.asarray(o["data"], dtype=np.float32).reshape(o["shape"]) for o in answer["outputs"]}


def test_ray_serve_sample_matches_jit(tmp_path):
    # The Triton repository's model with external data: the sample takes its model.onnx folder as it is.
    model_dir = hlo2onnx.write_triton_repo(hlo2onnx.convert(exported(False), dynamic=True), tmp_path,
                                           external_data=True)
    log = tmp_path / "sample.log"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    with one_ray_cluster_at_a_time(), open(log, "w") as err:
        port = free_port()
        # Its own session: were the test to end it by force, Ray's processes go with it.
        process = subprocess.Popen([sys.executable, SAMPLE, os.path.join(model_dir, "1", "model.onnx"),
                                    "--port", str(port), "--num-cpus", "2"], stdout=subprocess.PIPE,
                                   stderr=err, text=True, env=env, start_new_session=True)
        try:
            line = wait_for_line(process, "serving classifier at ", START_SECONDS, log)
            url = line.split(" at ", 1)[1].strip()
            assert url == f"http://127.0.0.1:{port}/v2/models/classifier/infer"
            base = url.rsplit("/v2/", 1)[0]
            for path, expected_answer in (("/v2/health/live", {"live": True}), ("/v2/health/ready", {"ready": True})):
                with urllib.request.urlopen(base + path, timeout=60) as response:
                    assert response.status == 200 and json.load(response) == expected_answer
            with urllib.request.urlopen(f"{base}/v2/models/classifier", timeout=60) as response:
                assert [t["name"] for t in json.load(response)["inputs"]] == ["x", "label"]
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(urllib.request.Request(url, data=b"not json"), timeout=60)
            assert refused.value.code == 400 and "not JSON" in json.load(refused.value)["error"]
            requests = [inputs(batch, False) for batch in BATCHES]
            with ThreadPoolExecutor(max_workers=8) as pool:  # concurrent: the replica batches them
                answers = list(pool.map(lambda xy: infer(url, *xy), requests))
            process.send_signal(signal.SIGINT)
            assert process.wait(timeout=STOP_SECONDS) == 0, log.read_text()[-4000:]
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            process.stdout.close()
    rtol, atol = TOLERANCE[np.dtype(np.float32)]
    for (x, label), answer in zip(requests, answers, strict=True):
        expected = jax.jit(classifier)(x, label)
        assert list(answer) == ["out0", "out1"]
        for actual, wanted in zip(answer.values(), expected, strict=True):
            assert actual.shape == wanted.shape
            np.testing.assert_allclose(actual, np.asarray(wanted), rtol=rtol * 10, atol=atol * 10)


# -- bad requests, refused by the sample's parse_request (no cluster needed) -------------------------------------
def _request(x=None, label=None, **changes):
    x = np.ones((2, 16), np.float32) if x is None else x
    label = np.zeros(2, np.int32) if label is None else label
    tensors = {"x": {"name": "x", "shape": list(np.shape(x)), "datatype": "FP32", "data": np.ravel(x).tolist()},
               "label": {"name": "label", "shape": list(np.shape(label)), "datatype": "INT32",
                         "data": np.ravel(label).tolist()}}
    for key, value in changes.items():  # "x_shape": [...] sets tensors["x"]["shape"]
        name, field = key.split("_", 1)
        tensors[name][field] = value
    return {"inputs": list(tensors.values())}


# Each joined into a batch with good requests failed them all (np.concatenate, ORT), or ran on a silently cast value.
BAD_REQUESTS = {
    "inner-dim": (_request(x=np.ones((2, 15), np.float32)), "must have the shape [batch, 16], got [2, 15]"),
    "rank": (_request(x=np.ones((2, 16, 1), np.float32)), "must have the shape [batch, 16]"),
    "float-for-int": (_request(label_data=[1.5, 0.0]), "takes INT32 data, got float64 values"),
    "int-out-of-range": (_request(label_data=[2**40, 0]), "out of the range of INT32"),
    "negative-shape": (_request(x_shape=[-1, 16]), "the shape must be a list of sizes"),
    "text-data": (_request(label_data=["a", "b"]), "takes INT32 data, got str"),
}


@pytest.fixture(scope="module")
def serve_ray():
    import importlib.util

    spec = importlib.util.spec_from_file_location("serve_ray_sample", SAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def model_inputs(serve_ray):
    model = hlo2onnx.convert(exported(False), dynamic=True).to_proto()
    return {value.name: serve_ray.input_spec(value) for value in model.graph.input}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_a_request_the_model_cannot_run_is_refused(case, serve_ray, model_inputs):
    body, message = BAD_REQUESTS[case]
    with pytest.raises(serve_ray.BadRequest, match=re.escape(message)):
        serve_ray.parse_request(body, model_inputs, 32)


def test_health_and_metadata_routes(serve_ray):
    graph = hlo2onnx.convert(exported(False), dynamic=True).to_proto().graph
    metadata = serve_ray.model_metadata("classifier", graph)
    assert [(t["name"], t["datatype"], t["shape"]) for t in metadata["inputs"]] == [
        ("x", "FP32", [-1, 16]), ("label", "INT32", [-1])]
    assert [t["name"] for t in metadata["outputs"]] == ["out0", "out1"]
    assert metadata["outputs"][0]["shape"][0] == -1
    route = serve_ray.route
    assert route("GET", "/v2/health/live", "classifier", metadata) == (200, {"live": True})
    assert route("GET", "/v2/health/ready/", "classifier", metadata) == (200, {"ready": True})
    assert route("GET", "/v2/models/classifier/ready", "classifier", metadata) == (200, {"ready": True})
    assert route("GET", "/v2/models/classifier", "classifier", metadata) == (200, metadata)
    assert route("POST", "/v2/models/classifier/infer", "classifier", metadata) is None
    status, answer = route("GET", "/v2/models/other", "classifier", metadata)
    assert status == 404 and "GET /v2/health/ready" in answer["error"]


@pytest.mark.parametrize("raw, message", [(b"not json", "the request body is not JSON (Expecting value"),
                                          (b"\xff\xfe", "the request body is not JSON"),
                                          (b"[1, 2]", "must be a JSON object, got list")])
def test_a_body_that_is_not_json_is_refused_with_a_message(serve_ray, raw, message):
    with pytest.raises(serve_ray.BadRequest, match=re.escape(message)):
        serve_ray.parse_body(raw)


def test_a_good_request_is_parsed(serve_ray, model_inputs):
    x, label = inputs(3, False)
    feeds = serve_ray.parse_request(_request(x, label), model_inputs, 32)
    np.testing.assert_array_equal(feeds["x"], x)
    np.testing.assert_array_equal(feeds["label"], label)
    assert feeds["x"].dtype == np.float32 and feeds["label"].dtype == np.int32
