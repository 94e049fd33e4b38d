"""shard_map over a mesh of one device: its collectives (psum, all_gather, ppermute, ...) have one participant,
the device itself, and return their operands; each case compared with jax.jit. A module lowered for several
devices is refused by name."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import Mesh, PartitionSpec as P

import hlo2onnx
from harness import Case, assert_same, rand, run_case
from mnjit.runtime import OrtRunner

try:
    from jax import shard_map
except ImportError:  # jax 0.10 keeps it in jax.experimental too
    from jax.experimental.shard_map import shard_map

_MESH = Mesh(np.array(jax.devices()[:1]), ("d",))
_MESH_2D = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("a", "b"))


def on_mesh(body, mesh=_MESH, spec=P("d")):
    return lambda x: shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)(x)


x23 = rand((2, 3))
CASES = [
    Case("psum", on_mesh(lambda v: v * 2 + lax.psum(v.sum(), "d")), (x23,)),
    Case("pmean_pmax_pmin", on_mesh(lambda v: lax.pmean(v, "d") + lax.pmax(v, "d") - lax.pmin(v, "d")), (x23,)),
    Case("psum_i32", on_mesh(lambda v: lax.psum(v.astype(jnp.int32), "d")), (x23 * 10,)),
    Case("psum_complex", on_mesh(lambda v: lax.psum(v * (1 + 2j), "d")), (x23,)),
    Case("all_gather", on_mesh(lambda v: lax.all_gather(v, "d")[0] + lax.all_gather(v, "d", tiled=True)), (x23,)),
    Case("axis_index", on_mesh(lambda v: v * (lax.axis_index("d") + 1)), (x23,)),
    Case("ppermute_to_itself", on_mesh(lambda v: lax.ppermute(v, "d", [(0, 0)])), (x23,)),
    Case("ppermute_to_nobody", on_mesh(lambda v: lax.ppermute(v, "d", []) + 1), (x23,)),  # zeros
    Case("ppermute_complex_to_nobody", on_mesh(lambda v: lax.ppermute(v * 1j, "d", [])), (x23,)),
    Case("all_gather_complex", on_mesh(lambda v: lax.all_gather(v * 1j, "d", tiled=True)), (x23,)),
    Case("psum_scatter", on_mesh(lambda v: lax.psum_scatter(v, "d", tiled=True)), (x23,)),
    Case("psum_scatter_complex", on_mesh(lambda v: lax.psum_scatter(v - 2j, "d", tiled=True)), (x23,)),
    Case("all_to_all", on_mesh(lambda v: lax.all_to_all(v[None], "d", 0, 0)[0]), (x23,)),  # jax elides it
    Case("mesh_2d", on_mesh(lambda v: lax.psum(v, ("a", "b")) + lax.axis_index("b"), _MESH_2D, P("a", "b")),
         (x23,)),
    Case("grad_psum", jax.grad(lambda x: on_mesh(lambda v: v * lax.psum(v.sum(), "d"))(x).sum()), (x23,)),
    Case("psum_f64", on_mesh(lambda v: lax.psum(v, "d")), (x23.astype(np.float64),), x64=True),
]


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_one_device_collectives(case: Case) -> None:
    run_case(case)


# Ops jax does not emit, from another producer's single-device module.
_ONE_DEVICE = """
module @f attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%x: tensor<3xf32>) -> tensor<3xf32> {
    %r = stablehlo.replica_id : tensor<ui32>
    %f = stablehlo.convert %r : (tensor<ui32>) -> tensor<f32>
    %b = stablehlo.broadcast_in_dim %f, dims = [] : (tensor<f32>) -> tensor<3xf32>
    %c = "stablehlo.collective_broadcast"(%x) <{replica_groups = dense<[[0]]> : tensor<1x1xi64>}>
      : (tensor<3xf32>) -> tensor<3xf32>
    %0 = stablehlo.add %c, %b : tensor<3xf32>
    return %0 : tensor<3xf32>
  }
}"""


def test_replica_id_and_collective_broadcast_of_another_producer() -> None:
    x = rand((3,))
    model = hlo2onnx.translate(hlo2onnx.parse_module(_ONE_DEVICE))
    spec = jax.ShapeDtypeStruct((3,), jnp.float32)
    (actual,) = OrtRunner(model, [spec], [spec]).run([x])
    assert_same(actual, jax.jit(lambda v: v + 0)(x))  # the one replica broadcasts to itself; its id is 0


_TWO_DEVICES = """
module @jit_f attributes {mhlo.num_partitions = 2 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%x: tensor<3xf32>) -> tensor<3xf32> {
    %0 = "stablehlo.all_reduce"(%x) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>,
      replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>, use_global_device_ids}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %1 = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %1 : tensor<f32>
    }) : (tensor<3xf32>) -> tensor<3xf32>
    return %0 : tensor<3xf32>
  }
}"""


def test_a_collective_over_several_devices_is_refused() -> None:
    with pytest.raises(hlo2onnx.UnsupportedOpError, match="stablehlo.all_reduce: .*lowered for 2 devices"):
        hlo2onnx.translate(hlo2onnx.parse_module(_TWO_DEVICES))
